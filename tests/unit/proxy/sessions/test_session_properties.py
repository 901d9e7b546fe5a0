"""Properties of the session book over generated call sequences (hypothesis): agents of two
tenants, some naming their session, some sub-agents naming their parent, step through their
conversations in any order, retry a call, send a prompt again with a correction, or (under an
id) start a new conversation. Whatever the order:

- an explicit id is never split: every call under it is one session;
- retries and corrections never split an implicit session;
- two tenants never share a session;
- a named child always attaches to its parent (its parent key, and its parent's family).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from talaria.proxy.contract.identity import Identity
from talaria.proxy.sessions.book import SessionBook
from talaria.proxy.sessions.conversation import Conversation, fingerprint
from talaria.proxy.sessions.resolve import resolve

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class Agent:
    tenant: str
    identity: Identity
    task: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)
    conversations: int = 0

    def __post_init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """A new conversation (under an id: compaction, or an independent question)."""
        self.conversations += 1
        self.messages = [
            {"role": "system", "content": f"agent of {self.task}"},
            {"role": "user", "content": f"{self.task}, part {self.conversations}"},
        ]


def _send(book: SessionBook, agent: Agent, prompt: list[dict[str, Any]], t: float) -> str:
    """One call of ``agent`` with ``prompt``; the proxy's reply is what the agent appends on
    a step (the same text), so a retry's or a step's reply continues the same history."""
    conversation = Conversation.of(prompt)
    found = resolve(book,
        tenant_id=agent.tenant, identity=agent.identity, model="m",
        conversation=conversation, now_s=t, now_at=NOW,
    )  # fmt: skip
    book.call_started(found.state, conversation, t, found.thread)
    reply = {"role": "assistant", "content": f"{agent.task} step {len(prompt)}",
             "tool_calls": [{"id": "c", "type": "function",
                             "function": {"name": "ls", "arguments": "{}"}}]}  # fmt: skip
    book.call_finished(found.state, conversation, fingerprint(reply), t, found.thread)
    book.call_ended(found.state, found.thread)
    agent.keys.add(found.state.key)
    return found.state.key


def _agents() -> list[Agent]:
    return [
        Agent("A", Identity(None, "implicit"), "implicit one"),
        Agent("A", Identity(None, "implicit"), "implicit two"),
        Agent("B", Identity(None, "implicit"), "implicit one"),  # the same task, another tenant
        Agent("A", Identity("run-1", "talaria"), "named"),
        Agent("B", Identity("run-1", "talaria"), "named"),  # the same id, another tenant
        Agent("A", Identity("sub-1", "claude-code", "run-1"), "sub-agent"),
    ]


ACTIONS = st.lists(
    st.tuples(st.integers(0, 5), st.sampled_from(["step", "retry", "correct", "restart"])),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ACTIONS)
def test_sessions_follow_what_the_agents_say(actions: list[tuple[int, str]]) -> None:
    book = SessionBook()
    agents = _agents()
    for t, (i, action) in enumerate(actions):
        agent = agents[i]
        if action == "restart" and agent.identity.explicit:
            agent.restart()
        elif action == "retry" and agent.keys:  # the same prompt again, nothing appended
            _send(book, agent, agent.messages[:-2], float(t))
            continue
        elif action == "correct" and agent.keys:  # the reply dropped, a correction appended
            agent.messages[-2:] = [{"role": "user", "content": f"use a tool ({t})"}]
        _send(book, agent, agent.messages, float(t))
        agent.messages += [
            {"role": "assistant", "content": f"{agent.task} step {len(agent.messages)}",
             "tool_calls": [{"id": "c", "type": "function",
                             "function": {"name": "ls", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": f"out {t}"},
        ]  # fmt: skip
    for agent in agents:
        if agent.keys:
            assert len(agent.keys) == 1, (agent.task, agent.tenant)  # never split
    owners: dict[str, str] = {}
    for agent in agents:
        for key in agent.keys:
            assert owners.setdefault(key, agent.tenant) == agent.tenant  # tenants never share
    shared = [a for a in agents if a.keys]
    assert len({k for a in shared for k in a.keys}) == len(shared)  # no two agents merged
    sub, parent = agents[5], agents[3]
    if sub.keys:
        child = book.get(next(iter(sub.keys)))
        assert child is not None
        if parent.keys and next(iter(parent.keys)) == child.parent_key:
            assert child.root_key == child.parent_key
            assert child in book.children(child.parent_key)
        else:  # the sub-agent came first: a root (its parent was not live)
            assert child.parent_key is None and child.is_root
