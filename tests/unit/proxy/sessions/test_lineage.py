"""The prefix a sub-agent's call shares with its parent's latest prompt, and the parent's key on
the runtime (proxy/sessions/lineage.py), table-driven."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from talaria.core.calls import Call, ToolSpec
from talaria.proxy.contract.calls import NormalisedPrompt, PreparedCall
from talaria.proxy.contract.identity import Identity
from talaria.proxy.sessions.book import SessionBook
from talaria.proxy.sessions.conversation import Conversation, tools_fingerprint
from talaria.proxy.sessions.lineage import (
    OPENING_MAX,
    exact_messages,
    opening,
    parent_of,
    shared_prefix,
)
from talaria.proxy.sessions.resolve import resolve
from talaria.proxy.sessions.state import NO_PARENT, Parent

MODEL = "glm-4.5-fp8"
BASH = ToolSpec("bash", "Run a shell command.", {"type": "object", "properties": {}})
READ = ToolSpec("read", "Read a file.", {"type": "object", "properties": {}})
SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 40}
NOTES = {"role": "system", "content": "Environment: linux, python 3.11. " * 10}
OTHER_SYSTEM = {"role": "system", "content": "You are a code reviewer. " * 40}
TASK = {"role": "user", "content": "Fix the failing build in src/."}
SUBTASK = {"role": "user", "content": "Find where the build flags are set."}
STEP = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    ],
}
RESULT = {"role": "tool", "tool_call_id": "c0", "content": "ok"}

Messages = list[dict[str, Any]]


def _call(
    messages: Messages,
    tools: tuple[ToolSpec, ...] = (BASH,),
    model: str = MODEL,
    normalised_first: int | None = None,
    engine_gets_normalised: bool = True,
) -> tuple[PreparedCall, Conversation]:
    normalised = None
    if normalised_first is not None:
        normalised = NormalisedPrompt(
            ("claude-code-attribution",),
            tuple(messages),
            normalised_first,
            engine_gets_normalised,
        )
    call = PreparedCall(
        request_id="r",
        tenant_id="t",
        identity=Identity("s", "talaria"),
        api="chat",
        content=Call(model=model, messages=tuple(messages), tools=tools),
        max_tokens=16,
        normalised=normalised,
    )
    return call, Conversation.of(messages)


def _tokens(*messages: dict[str, Any]) -> int:
    return Conversation.of(list(messages)).tokens[-1]


TOOLS = tools_fingerprint((BASH,)).tokens

# (case, parent's messages, child's messages, child's tools, expected shared tokens)
CASES: list[tuple[str, Messages, Messages, tuple[ToolSpec, ...], int]] = [
    ("same system and tools", [SYSTEM, TASK], [SYSTEM, SUBTASK], (BASH,), TOOLS + _tokens(SYSTEM)),
    (
        "two system messages",
        [SYSTEM, NOTES, TASK],
        [SYSTEM, NOTES, SUBTASK],
        (BASH,),
        TOOLS + _tokens(SYSTEM, NOTES),
    ),
    (
        "the second system message differs",
        [SYSTEM, NOTES, TASK],
        [SYSTEM, OTHER_SYSTEM, SUBTASK],
        (BASH,),
        TOOLS + _tokens(SYSTEM),
    ),
    ("other tools", [SYSTEM, TASK], [SYSTEM, SUBTASK], (BASH, READ), 0),
    ("no tools on the child", [SYSTEM, TASK], [SYSTEM, SUBTASK], (), 0),
    ("other system prompt", [SYSTEM, TASK], [OTHER_SYSTEM, SUBTASK], (BASH,), TOOLS),
    (
        "the same task too",
        [SYSTEM, TASK, STEP, RESULT],
        [SYSTEM, TASK],
        (BASH,),
        TOOLS + _tokens(SYSTEM, TASK),
    ),
    (
        "an assistant message is never compared",
        [SYSTEM, TASK, STEP, RESULT],
        [SYSTEM, TASK, STEP, RESULT, SUBTASK],
        (BASH,),
        TOOLS + _tokens(SYSTEM, TASK),
    ),
    ("the child has no messages", [SYSTEM, TASK], [], (BASH,), TOOLS),
]


@pytest.mark.parametrize(
    ("parent", "child", "tools", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_the_shared_prefix(
    parent: Messages, child: Messages, tools: tuple[ToolSpec, ...], expected: int
) -> None:
    began = opening(*_call(parent), tools_fingerprint((BASH,)), thread=0)
    call, conversation = _call(child, tools)
    assert shared_prefix(began, call, conversation, tools_fingerprint(tools)) == expected


def test_without_tools_on_either_side_the_system_prompt_alone_is_shared() -> None:
    none = tools_fingerprint(())
    began = opening(*_call([SYSTEM, TASK], tools=()), none, thread=0)
    call, conversation = _call([SYSTEM, SUBTASK], tools=())
    assert shared_prefix(began, call, conversation, none) == _tokens(SYSTEM)


def test_another_model_shares_nothing() -> None:
    tools = tools_fingerprint((BASH,))
    began = opening(*_call([SYSTEM, TASK]), tools, thread=0)
    call, conversation = _call([SYSTEM, SUBTASK], model="qwen3-coder-30b")
    assert shared_prefix(began, call, conversation, tools) == 0


def test_the_opening_is_bounded() -> None:
    many = [{"role": "system", "content": f"rule {k}"} for k in range(OPENING_MAX + 4)]
    tools = tools_fingerprint((BASH,))
    began = opening(*_call([*many, TASK]), tools, thread=0)
    assert len(began.digests) == OPENING_MAX
    call, conversation = _call([*many, SUBTASK])
    assert shared_prefix(began, call, conversation, tools) == tools.tokens + _tokens(
        *many[:OPENING_MAX]
    )


@pytest.mark.parametrize(
    ("parent_first", "child_first", "engine", "expected"),
    [
        (None, None, False, TOOLS + _tokens(SYSTEM, NOTES)),
        (None, 1, False, TOOLS + _tokens(SYSTEM)),  # the child's NOTES reached the engine raw
        (1, None, False, TOOLS + _tokens(SYSTEM)),  # so did the parent's
        (None, 0, False, TOOLS),
        (0, 0, True, TOOLS + _tokens(SYSTEM, NOTES)),  # the engine got the normalised text
    ],
)
def test_a_normalised_message_the_engine_did_not_get_is_never_shared(
    parent_first: int | None, child_first: int | None, engine: bool, expected: int
) -> None:
    """With normalisation not passed on to the engine, only the messages before the first
    normalised one are compared (as the gateway's own ``shared`` estimate)."""
    tools = tools_fingerprint((BASH,))
    parent = _call(
        [SYSTEM, NOTES, TASK], normalised_first=parent_first, engine_gets_normalised=engine
    )
    began = opening(*parent, tools, thread=0)
    call, conversation = _call(
        [SYSTEM, NOTES, SUBTASK], normalised_first=child_first, engine_gets_normalised=engine
    )
    assert shared_prefix(began, call, conversation, tools) == expected


def test_exact_messages() -> None:
    assert exact_messages(*_call([SYSTEM, TASK])) == 2
    assert (
        exact_messages(*_call([SYSTEM, TASK], normalised_first=0, engine_gets_normalised=False))
        == 0
    )
    assert exact_messages(*_call([SYSTEM, TASK], normalised_first=0)) == 2


# -- the parent's key ----------------------------------------------------------------------


def _open(book: SessionBook, sid: str, parent: str | None = None, tenant: str = "t") -> Any:
    _, conversation = _call([SYSTEM, TASK])
    found = resolve(
        book,
        tenant_id=tenant,
        identity=Identity(sid, "talaria", parent),
        model=MODEL,
        conversation=conversation,
        now_s=0.0,
        now_at=datetime.now(UTC),
    )
    return found


def _child_parent(book: SessionBook, child: Any) -> Parent:
    call, conversation = _call([SYSTEM, SUBTASK])
    return parent_of(book, child.state, call, conversation, tools_fingerprint((BASH,)))


def test_the_parent_s_key_is_its_latest_call_s_thread() -> None:
    book = SessionBook()
    parent = _open(book, "p")
    call, conversation = _call([SYSTEM, TASK])
    tools = tools_fingerprint((BASH,))
    parent.state.opening = opening(call, conversation, tools, parent.thread)
    child = _open(book, "c", parent="p")
    assert child.state.parent_key == parent.state.key
    expected = TOOLS + _tokens(SYSTEM)
    assert _child_parent(book, child) == Parent(parent.state.key, expected)

    # The parent's latest call ran in another thread: that thread's key.
    other = _call([OTHER_SYSTEM, TASK])
    again = resolve(
        book,
        tenant_id="t",
        identity=Identity("p", "talaria"),
        model=MODEL,
        conversation=other[1],
        now_s=1.0,
        now_at=datetime.now(UTC),
    )
    assert again.thread != parent.thread
    parent.state.opening = opening(*other, tools, again.thread)
    assert _child_parent(book, child) == Parent(f"{parent.state.key}/{again.thread}", TOOLS)


def test_no_parent_to_tell() -> None:
    book = SessionBook()
    root = _open(book, "root")
    assert _child_parent(book, root) == NO_PARENT  # a root
    child = _open(book, "c", parent="root")
    assert _child_parent(book, child) == NO_PARENT  # the parent has had no call yet
    root.state.opening = opening(*_call([SYSTEM, TASK]), tools_fingerprint((BASH,)), 0)
    assert _child_parent(book, child).key == root.state.key
    root.state.tenant_id = "another"  # never so (resolve.py), and never told
    assert _child_parent(book, child) == NO_PARENT
    root.state.tenant_id = "t"
    root.state.opening = opening(*_call([SYSTEM, TASK]), tools_fingerprint((BASH,)), 7)
    assert _child_parent(book, child) == NO_PARENT  # that thread is gone
    root.state.opening = opening(*_call([SYSTEM, TASK]), tools_fingerprint((BASH,)), 0)
    book.forget(root.state)
    assert _child_parent(book, child) == NO_PARENT  # ended


def test_another_tenant_s_session_is_never_a_parent() -> None:
    book = SessionBook()
    theirs = _open(book, "p", tenant="other")
    theirs.state.opening = opening(*_call([SYSTEM, TASK]), tools_fingerprint((BASH,)), 0)
    mine = _open(book, "c", parent="p")
    assert mine.state.parent_key is None
    assert _child_parent(book, mine) == NO_PARENT
