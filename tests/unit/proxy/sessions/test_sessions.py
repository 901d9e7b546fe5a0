"""Finding sessions without the client's help: identity from headers and bodies, conversation
fingerprints that survive what agents do to a reply, and the book that matches calls to the
sessions they continue (per tenant and model, children for named sessions)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talaria.core.types import Priority
from talaria.proxy.contract.identity import Identity
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.edge.app import create_app
from talaria.proxy.sessions.book import SessionBook
from talaria.proxy.sessions.conversation import Conversation, chain, fingerprint, fingerprints
from talaria.proxy.sessions.identity import (
    IdentityError,
    identify,
    named_by_header,
    session_sources,
)
from talaria.proxy.sessions.resolve import resolve

UUID = "8fd329df-62cd-4923-84ca-17ec4376a91f"


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        ({"x-talaria-session-id": "a", "x-claude-code-session-id": "b"}, {}, ("a", "talaria")),
        ({"x-claude-code-session-id": UUID, "session-id": "c"}, {}, (UUID, "claude-code")),
        (
            {},
            {"metadata": {"user_id": json.dumps({"device_id": "d", "session_id": UUID})}},
            (UUID, "claude-code"),
        ),
        (
            {},
            {"metadata": {"user_id": f"user_ab12_account_{UUID}_session_{UUID}"}},
            (UUID, "claude-code"),
        ),
        ({"session-id": "s1", "thread-id": "t1"}, {"prompt_cache_key": "k"}, ("s1", "codex")),
        ({"thread-id": "t1"}, {}, ("t1", "codex")),
        ({"x-dynamo-session-id": "d1"}, {"prompt_cache_key": "k"}, ("d1", "dynamo")),
        ({"thread-id": "t1", "x-dynamo-session-id": "d1"}, {}, ("t1", "codex")),
        ({"x-session-id": "x"}, {"prompt_cache_key": "k"}, ("k", "prompt_cache_key")),
        ({"x-session-id": "x", "x-litellm-session-id": "y"}, {}, ("x", "x-session-id")),
        # OpenCode sends both with the same value; either alone names the session
        ({"x-session-affinity": "o", "x-session-id": "o"}, {}, ("o", "x-session-id")),
        ({"x-session-affinity": "o"}, {"litellm_session_id": "z"}, ("o", "x-session-affinity")),
        ({"x-litellm-session-id": "y"}, {"litellm_session_id": "z"}, ("y", "x-litellm-session-id")),
        ({}, {"litellm_session_id": "z"}, ("z", "litellm_session_id")),
        ({}, {"metadata": {"user_id": "not-claude"}}, (None, "implicit")),
        ({}, {}, (None, "implicit")),
    ],
)
def test_identity_sources_in_order(
    headers: dict[str, str], body: dict[str, Any], expected: tuple[str | None, str]
) -> None:
    found = identify(headers, body)
    assert (found.session_id, found.source) == expected


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # The User-Agent's product name (docs/sources.md §9: what each agent sends) ...
        (
            {"user-agent": "claude-cli/2.0.14 (external, cli)", **{"x-session-id": "s"}},
            "claude-cli",
        ),
        ({"user-agent": "codex_cli_rs/0.46.0 (Debian 12; x86_64) dumb"}, "codex_cli_rs"),
        ({"user-agent": "OpenAI/Python 1.109.1"}, "openai"),
        ({"user-agent": "QwenCode"}, "qwencode"),
        # ... else where the session id came from
        ({"x-session-id": "s"}, "x-session-id"),
        ({"session-id": "s", "user-agent": "  "}, "codex"),
        ({"x-session-id": "s", "user-agent": "(compatible; bot)/1"}, "x-session-id"),
        ({"x-session-id": "s", "user-agent": "a" * 41 + "/1"}, "x-session-id"),
        ({"user-agent": "a" * 40 + "/1"}, "a" * 40),
        ({}, "implicit"),
    ],
)
def test_the_agents_kind_is_its_user_agents_product_else_its_identity_source(
    headers: dict[str, str], expected: str
) -> None:
    assert identify(headers, {}).agent == expected


CC_SESSION = {"x-claude-code-session-id": UUID}


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # (session id, source, parent id, the id the family is placed by)
        (CC_SESSION, (UUID, "claude-code", None, UUID)),
        ({**CC_SESSION, "x-claude-code-agent-id": "a1"}, ("a1", "claude-code", UUID, UUID)),
        (
            {**CC_SESSION, "x-claude-code-agent-id": "a2", "x-claude-code-parent-agent-id": "a1"},
            ("a2", "claude-code", "a1", UUID),
        ),
        ({"x-claude-code-agent-id": "a1"}, (None, "implicit", None, None)),  # no session: none
        (
            {"session-id": "s", "thread-id": "t2", "x-codex-parent-thread-id": "t1"},
            ("t2", "codex", "t1", "t1"),
        ),
        ({"session-id": "s", "thread-id": "t1"}, ("s", "codex", None, "s")),
        (
            {"x-talaria-session-id": "c", "x-talaria-parent-session-id": "p"},
            ("c", "talaria", "p", "p"),
        ),
        (
            {"x-dynamo-session-id": "c", "x-dynamo-parent-session-id": "p"},
            ("c", "dynamo", "p", "p"),
        ),
        ({"x-session-id": "c", "x-parent-session-id": "p"}, ("c", "x-session-id", "p", "p")),
    ],
)
def test_children_are_named_by_the_agents_own_headers(
    headers: dict[str, str], expected: tuple[str | None, str, str | None, str | None]
) -> None:
    found = identify(headers, {})
    assert (found.session_id, found.source, found.parent_session_id, found.placed_by) == expected


@pytest.mark.parametrize("name", ["x-talaria-session-final", "x-dynamo-session-final"])
def test_a_final_header_ends_the_session(name: str) -> None:
    assert identify({name: "true", "x-session-id": "s"}, {}).final
    assert not identify({name: "false", "x-session-id": "s"}, {}).final


@pytest.mark.parametrize(
    ("headers", "body", "field"),
    [
        ({"x-talaria-session-id": "x" * 201}, {}, "X-Talaria-Session-Id"),
        ({}, {"prompt_cache_key": "bad\nid"}, "prompt_cache_key"),
        ({}, {"prompt_cache_key": "emoji 🙂"}, "prompt_cache_key"),
        ({}, {"litellm_session_id": "nul\x00"}, "litellm_session_id"),
        ({}, {"prompt_cache_key": "rtl\u202e"}, "prompt_cache_key"),
        ({"x-talaria-parent-session-id": "p" * 300}, {}, "X-Talaria-Parent-Session-Id"),
        ({"x-dynamo-parent-session-id": "p" * 201}, {}, "X-Dynamo-Parent-Session-ID"),
        ({**CC_SESSION, "x-claude-code-agent-id": "a" * 201}, {}, "x-claude-code-agent-id"),
        ({"x-talaria-tool-gap-ms": "inf"}, {}, "X-Talaria-Tool-Gap-Ms"),
        ({"x-talaria-tool-gap-ms": "nan"}, {}, "X-Talaria-Tool-Gap-Ms"),
        ({"x-talaria-tool-gap-ms": "1e308"}, {}, "X-Talaria-Tool-Gap-Ms"),
        ({"x-talaria-tool-gap-ms": "-5"}, {}, "X-Talaria-Tool-Gap-Ms"),
        ({"x-talaria-tool-gap-ms": "soon"}, {}, "X-Talaria-Tool-Gap-Ms"),
        ({"x-talaria-priority": "urgent"}, {}, "X-Talaria-Priority"),
        ({"x-talaria-deadline-s": "0"}, {}, "X-Talaria-Deadline-S"),
        ({"x-talaria-deadline-s": "nan"}, {}, "X-Talaria-Deadline-S"),
        ({"x-talaria-deadline-s": "1e9"}, {}, "X-Talaria-Deadline-S"),
    ],
)
def test_malformed_ids_and_hints_name_their_field(
    headers: dict[str, str], body: dict[str, Any], field: str
) -> None:
    with pytest.raises(IdentityError) as info:
        identify(headers, body)
    assert info.value.field == field


def test_priority_and_deadline_headers_are_the_calls_hints() -> None:
    told = identify({"x-talaria-priority": "Batch", "x-talaria-deadline-s": "1.5"}, {})
    assert (told.priority, told.deadline_s, told.explicit) == (Priority.BATCH, 1.5, False)
    assert (identify({}, {}).priority, identify({}, {}).deadline_s) == (None, None)
    with pytest.raises(IdentityError) as info:
        identify({"x-talaria-priority": "high"}, {})
    assert info.value.code == "invalid_value" and "interactive, standard, batch" in str(info.value)


_BODIES = [
    {},
    {"metadata": {"user_id": json.dumps({"session_id": UUID})}},
    {"prompt_cache_key": "k", "litellm_session_id": "z"},
]


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"x-talaria-session-id": "a"}, True),
        ({"x-claude-code-session-id": UUID, "session-id": "c"}, True),
        ({"x-talaria-session-id": "  ", "x-claude-code-session-id": UUID}, True),
        ({"x-talaria-session-id": " "}, False),
        ({"session-id": "s1"}, False),
        ({"x-session-id": "x"}, False),
        ({}, False),
    ],
)
def test_a_session_named_by_an_outranking_header_is_known_before_the_body(
    headers: dict[str, str], named: bool
) -> None:
    """``named_by_header``: the body cannot change the identity, so the API layer identifies
    such a call (and places it among replicas) before it parses the body."""
    assert named_by_header(headers) is named
    if named:
        assert all(identify(headers, body) == identify(headers, {}) for body in _BODIES)
    else:
        assert any(identify(headers, body) != identify(headers, {}) for body in _BODIES)


@pytest.mark.parametrize(
    ("extra", "headers", "body", "expected"),
    [
        # after the built-in rows: named only when nothing else names the session
        ("x-acme-run", {"x-acme-run": "r1"}, {}, ("r1", "x-acme-run")),
        ("x-acme-run", {"x-acme-run": "r1"}, {"litellm_session_id": "z"},
         ("z", "litellm_session_id")),
        ("X-Acme-Run", {"x-acme-run": "r1"}, {}, ("r1", "x-acme-run")),  # names are lower-cased
        # at rank 1: above X-Talaria-Session-Id and every body field
        ("x-acme-run:1", {"x-acme-run": "r1", "x-talaria-session-id": "t"}, {},
         ("r1", "x-acme-run")),
        ("x-acme-run:1", {"x-acme-run": "r1"}, {"prompt_cache_key": "k"}, ("r1", "x-acme-run")),
        # two, the second ranked first
        ("a-run, b-run:2", {"a-run": "a", "b-run": "b"}, {}, ("b", "b-run")),
        ("", {"x-acme-run": "r1"}, {}, (None, "implicit")),
    ],
)  # fmt: skip
def test_an_operators_session_headers_name_sessions_at_their_rank(
    extra: str, headers: dict[str, str], body: dict[str, Any], expected: tuple[str | None, str]
) -> None:
    sources = session_sources(extra)
    found = identify(headers, body, sources)
    assert (found.session_id, found.source) == expected
    if extra.endswith(":1"):  # ranked above every body field: known before the body is read
        assert named_by_header({"x-acme-run": "r1"}, sources)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("x acme", "'x acme' is not an HTTP header name"),
        ("x-acme:run", "the rank must be 1 to"),
        ("x-acme:0", "the rank must be 1 to"),
        ("x-acme:99", "the rank must be 1 to 12"),
        ("X-Session-Affinity", "x-session-affinity is already a session header"),
        ("x-a,x-a", "x-a is already a session header"),
        ("x-é", "is not an HTTP header name"),
    ],
)
def test_a_bad_session_header_is_refused_naming_it(extra: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        session_sources(extra)
    with pytest.raises(ValueError, match=message):  # the proxy does not start
        create_app(ProxySettings(session_headers=extra))


def _call(name: str, args: Any, call_id: str = "c1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def test_fingerprints_ignore_what_agents_change_in_a_reply() -> None:
    ours = {
        "role": "assistant",
        "content": "Listing.",
        "tool_calls": [_call("ls", '{"path": ".", "all": true}')],
        "reasoning_content": "I should look first.",
    }
    echoed = {  # re-serialized arguments, other id, text as parts, thinking dropped
        "role": "assistant",
        "content": [{"type": "text", "text": "Listing.\n"}],
        "tool_calls": [_call("ls", {"all": True, "path": "."}, call_id="toolu_9")],
    }
    assert fingerprint(ours).digest == fingerprint(echoed).digest
    assert fingerprint({"role": "developer", "content": "x"}).digest == (
        fingerprint({"role": "system", "content": "x"}).digest
    )


@pytest.mark.parametrize(
    "other",
    [
        {"role": "user", "content": "Listing."},
        {"role": "assistant", "content": "Listing!"},
        {"role": "assistant", "content": "Listing.", "tool_calls": [_call("cat", "{}")]},
        {"role": "assistant", "content": "Listing.", "tool_calls": [_call("ls", '{"p": 1}')]},
    ],
)
def test_fingerprints_see_what_matters(other: dict[str, Any]) -> None:
    base = {"role": "assistant", "content": "Listing.", "tool_calls": [_call("ls", "{}")]}
    assert fingerprint(base).digest != fingerprint(other).digest


def test_fingerprint_fields_do_not_run_into_each_other() -> None:
    # the same bytes end to end, cut into fields at other places (the digest length-prefixes
    # each field); and two calls are not one
    one = {"role": "assistant", "content": "", "tool_calls": [_call("ab", "c")]}
    other = {"role": "assistant", "content": "", "tool_calls": [_call("a", "bc")]}
    assert fingerprint(one).digest != fingerprint(other).digest
    two = {"role": "assistant", "content": "", "tool_calls": [_call("a", "b"), _call("c", "d")]}
    merged = {"role": "assistant", "content": "", "tool_calls": [_call("a", "bcd")]}
    assert fingerprint(two).digest != fingerprint(merged).digest


NOW = datetime(2026, 11, 30, tzinfo=UTC)
IMPLICIT = Identity(None, "implicit")


class Agent:
    """A conversation against the book: each step sends the history, then appends the reply
    the proxy 'gave' and a tool result."""

    def __init__(self, book: SessionBook, task: str, tenant: str = "t", model: str = "m") -> None:
        self.book, self.tenant, self.model = book, tenant, model
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": task},
        ]
        self.steps = 0

    def step(self, identity: Identity = IMPLICIT, reply_text: str | None = None) -> Any:
        prints = Conversation.of(self.messages)
        found = resolve(
            self.book,
            tenant_id=self.tenant,
            identity=identity,
            model=self.model,
            conversation=prints,
            now_s=float(self.steps),
            now_at=NOW,
        )
        self.book.call_started(found.state, prints, float(self.steps), found.thread)
        reply = {
            "role": "assistant",
            "content": f"step {self.steps} of {self.messages[1]['content']}",
            "tool_calls": [_call("ls", "{}", f"c{self.steps}")],
        }
        self.book.call_finished(
            found.state, prints, fingerprint(reply), float(self.steps), found.thread
        )
        self.book.call_ended(found.state, found.thread)
        if reply_text is not None:  # the agent rewrote our reply before sending it back
            reply = {**reply, "content": reply_text}
        self.messages += [
            reply,
            {"role": "tool", "tool_call_id": f"c{self.steps}", "content": "ok"},
        ]
        self.steps += 1
        return found


def test_an_implicit_conversation_is_one_session_with_growing_reuse() -> None:
    book = SessionBook()
    agent = Agent(book, "fix the bug")
    found = [agent.step() for _ in range(4)]
    assert [f.how for f in found] == ["new", "continued", "continued", "continued"]
    assert len({f.state.key for f in found}) == 1
    shared = [f.shared_tokens for f in found]
    assert shared[0] == 0 and shared[1:] == sorted(shared[1:]) and shared[1] > 0


def test_two_agents_with_the_same_start_stay_apart() -> None:
    book = SessionBook()
    a, b = Agent(book, "same task"), Agent(book, "same task")
    first_a, first_b = a.step(), b.step()  # identical first calls: b retries a's prompt...
    assert first_b.how == "retry" and first_b.state is first_a.state
    # ...but once the replies differ, each continues its own history (the longest match)
    b.messages[2]["content"] = "a different reply"
    b.messages[2]["tool_calls"] = [_call("cat", "{}", "cX")]
    assert a.step().state is first_a.state
    assert b.step().how == "new"


def test_a_continuation_of_its_own_reply_beats_a_repeat_of_another_sessions_prompt() -> None:
    """Two runs of a deterministic agent: the second run's second call repeats the first
    run's last prompt exactly, and continues the reply the second run got; it stays in its
    own session (the first run, in its tool gap, is not robbed)."""
    book = SessionBook()
    first_run = Agent(book, "same task")
    first_run.step()
    first_run.step()  # a step ahead: its last prompt is [system, task, reply 0, result 0]
    opening, reply = Conversation.of(first_run.messages[:2]), first_run.messages[2]
    second = resolve(
        book, tenant_id="t", identity=IMPLICIT, model="m", conversation=opening, now_s=9.0,
        now_at=NOW,
    )  # fmt: skip
    book.call_started(second.state, opening, 9.0, second.thread)
    book.call_finished(second.state, opening, fingerprint(reply), 9.0, second.thread)
    assert second.how == "new"
    again = resolve(
        book, tenant_id="t", identity=IMPLICIT, model="m",
        conversation=Conversation.of(first_run.messages[:4]), now_s=10.0, now_at=NOW,
    )  # fmt: skip
    assert again.state is second.state and again.how == "continued"


@pytest.mark.parametrize(
    ("appended", "how"),
    [
        ([], "retry"),
        ([{"role": "user", "content": "No tool call found; call a tool."}], "corrected"),
        ([{"role": "assistant", "content": "an answer"}, {"role": "user", "content": "no"}],
         "continued"),
    ],
)  # fmt: skip
def test_a_discarded_reply_and_a_correction_continue_the_session(
    appended: list[dict[str, Any]], how: str
) -> None:
    book = SessionBook()
    agent = Agent(book, "task")
    first = agent.step()
    prompt = agent.messages[:2] + appended  # the reply dropped, the prompt sent again
    found = resolve(
        book, tenant_id="t", identity=IMPLICIT, model="m",
        conversation=Conversation.of(prompt), now_s=5.0, now_at=NOW,
    )  # fmt: skip
    assert found.state is first.state and found.how == how
    assert found.shared_tokens > 0


def test_a_reply_the_agent_rewrote_still_continues() -> None:
    book = SessionBook()
    agent = Agent(book, "task")
    first = agent.step(reply_text="(the agent kept only a summary of the reply)")
    assert agent.step().state is first.state


def test_a_rewritten_history_never_joins() -> None:
    book = SessionBook()
    agent = Agent(book, "task")
    first = agent.step()
    agent.step()
    agent.messages[1]["content"] = "task, edited"
    assert agent.step().state is not first.state


def test_sessions_are_per_tenant_and_model() -> None:
    book = SessionBook()
    a = Agent(book, "task", tenant="A")
    b = Agent(book, "task", tenant="B")
    c = Agent(book, "task", model="other")
    keys = {a.step().state.key, b.step().state.key, c.step().state.key}
    assert len(keys) == 3
    named = Identity("task-1", "talaria")
    ka = Agent(book, "x", tenant="A").step(named).state
    kb = Agent(book, "x", tenant="B").step(named).state
    assert ka is not kb and ka.session_id == kb.session_id == "task-1"
    assert book.named("A", "task-1") is ka and book.named("B", "task-1") is kb
    assert book.named("B", ka.key) is None  # no tenant reaches another's session by key


def test_a_named_session_keeps_other_conversations_as_its_threads() -> None:
    """An explicit id is authoritative: a call under it that continues none of its
    conversations is a new thread of the same session, never a child or a new session."""
    book = SessionBook()
    named = Identity(UUID, "claude-code")
    main, side = Agent(book, "the task"), Agent(book, "summarize the repo")
    side.messages[0] = {"role": "system", "content": "You write titles."}
    root = main.step(named)
    other = side.step(named)
    assert other.how == "thread" and other.state is root.state and other.thread == 1
    assert side.step(named).thread == 1  # each conversation continues its own thread
    assert main.step(named).thread == 0
    assert book.children(root.state.key) == [] and len(book) == 1
    assert root.state.runtime_key(0) == root.state.key
    assert root.state.runtime_key(1) == f"{root.state.key}/1"  # its own KV on the runtime


def test_a_compacted_history_under_an_id_is_a_thread_of_the_session() -> None:
    book = SessionBook()
    named = Identity("task-9", "talaria")
    agent = Agent(book, "the task")
    first = agent.step(named)
    agent.step(named)
    agent.messages[2:] = [{"role": "user", "content": "Summary of the work so far: ..."}]
    compacted = agent.step(named)
    assert compacted.how == "compacted" and compacted.state is first.state
    assert compacted.thread == 1 and agent.step(named).thread == 1


@pytest.mark.parametrize(("rewritten", "drift"), [(0, 0), (3, 3)])
def test_a_rewritten_message_under_an_id_is_prefix_drift(rewritten: int, drift: int) -> None:
    """A volatile system-prompt line (message 0) or a re-rendered tool result (message 3):
    the thread's next call, with only the KV before that message reusable."""
    book = SessionBook()
    named = Identity("task-d", "talaria")
    agent = Agent(book, "the task")
    for _ in range(3):
        first = agent.step(named)
    agent.messages[rewritten] = {**agent.messages[rewritten], "content": "changed, 12:01"}
    found = agent.step(named)
    assert found.how == "drifted" and found.drift_at == drift
    assert found.state is first.state and found.thread == 0
    assert found.shared_tokens == Conversation.of(agent.messages[:drift]).tokens[-1]
    assert agent.step(named).how == "continued"  # and the thread goes on from there


def test_a_short_or_much_changed_prompt_is_no_drift() -> None:
    book = SessionBook()
    named = Identity("task-e", "talaria")
    agent = Agent(book, "the task")
    agent.step(named)
    agent.step(named)
    agent.messages = [{"role": "system", "content": "other"}, {"role": "user", "content": "q"}]
    assert agent.step(named).how == "thread"  # shorter than the thread's prompt: a new one


def test_children_only_when_named() -> None:
    book = SessionBook()
    root = Agent(book, "the task").step(Identity("main", "claude-code")).state
    sub = Agent(book, "explore the repo")
    child_id = Identity("agent-7", "claude-code", parent_session_id="main")
    child = sub.step(child_id)
    assert child.how == "child" and child.state.parent_key == root.key
    assert child.state.root_key == root.key and child.state.session_id == "agent-7"
    assert sub.step(child_id).state is child.state  # the sub-agent continues its own
    grandchild = Agent(book, "grep").step(Identity("agent-8", "claude-code", "agent-7"))
    assert grandchild.state.parent_key == child.state.key
    assert [s.key for s in book.children(root.key)] == sorted(
        [child.state.key, grandchild.state.key]
    )
    orphan = Agent(book, "x").step(Identity("agent-9", "claude-code", "gone")).state
    assert orphan.parent_key is None and orphan.is_root  # no live parent: a root
    assert Agent(book, "implicit").step().state.parent_key is None


def _open_call(book: SessionBook, messages: list[dict[str, Any]], tools: bool = True) -> Any:
    """A call sent and not answered yet (its session waits on the reply)."""
    prompt = Conversation.of(messages)
    found = resolve(
        book, tenant_id="t", identity=IMPLICIT, model="m", conversation=prompt, now_s=1.0,
        now_at=NOW, offers_tools=tools,
    )  # fmt: skip
    book.call_started(found.state, prompt, 1.0, found.thread)
    return found


SIDE = [
    {"role": "system", "content": "Write a five-word title for this conversation."},
    {"role": "user", "content": "the user asked to fix the bug"},
]


@pytest.mark.parametrize(
    ("waiting", "tools", "side", "attached"),
    [
        (1, False, SIDE, True),  # one session waits on a reply: its side call
        (2, False, SIDE, False),  # two wait: ambiguous, apart
        (0, False, SIDE, False),  # none waits: apart
        (1, True, SIDE, False),  # it offers tools: another agent starting, apart
        (1, False, SIDE[1:], False),  # no system prompt of its own: apart
    ],
)
def test_an_implicit_side_call_joins_only_on_unambiguous_evidence(
    waiting: int, tools: bool, side: list[dict[str, Any]], attached: bool
) -> None:
    book = SessionBook()
    mains = [_open_call(book, Agent(book, f"task {i}").messages) for i in range(waiting)]
    found = _open_call(book, side, tools=tools)
    if attached:
        assert found.how == "child" and found.state.parent_key == mains[0].state.key
        assert found.state.root_key == mains[0].state.key
    else:
        assert found.how == "new" and found.state.parent_key is None


def test_forgotten_sessions_leave_no_trace_in_the_index() -> None:
    book = SessionBook()
    agent = Agent(book, "task")
    first = agent.step()
    book.forget(first.state)
    assert agent.step().how == "new" and len(book) == 1


def test_idle_sessions() -> None:
    book = SessionBook()
    state = Agent(book, "task").step().state
    assert book.idle(now_s=100.0, timeout_s=600.0) == []
    assert book.idle(now_s=700.0, timeout_s=600.0) == [state]
    state.inflight = 1
    assert book.idle(now_s=700.0, timeout_s=600.0) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=40))
def test_interleaved_conversations_never_mix(order: list[int]) -> None:
    """Five implicit agents with distinct tasks, stepping in any order: each conversation is
    one session, and no session holds two conversations."""
    book = SessionBook()
    agents = [Agent(book, f"task {i}") for i in range(5)]
    seen: dict[int, set[str]] = {}
    for i in order:
        seen.setdefault(i, set()).add(agents[i].step().state.key)
    assert all(len(keys) == 1 for keys in seen.values())
    owners = [next(iter(keys)) for keys in seen.values()]
    assert len(owners) == len(set(owners))


def test_a_conversation_computes_its_chain_and_token_sums_once() -> None:
    messages = [{"role": "user", "content": "a" * 40}, {"role": "assistant", "content": "b"}]
    conversation = Conversation.of(messages)
    prints = fingerprints(messages)
    assert list(conversation.hashes) == chain(prints)
    assert conversation.tokens == (0, prints[0].tokens, prints[0].tokens + prints[1].tokens)
    assert conversation.last == chain(prints)[-1] and len(conversation) == 2
