"""The cap on a tenant's live sessions and threads (``SessionBook(max_per_tenant=...)``): a
call that would open a session or a new thread of one past it is refused; continuations,
retries and take-overs never are; an ended session frees its place; other tenants are
unaffected. The bound on one session's threads (``max_threads``): the least recently used
idle thread is retired, with its runtime entry; all busy, the call is refused."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from talaria.proxy.contract.identity import Identity
from talaria.proxy.sessions.book import SessionBook
from talaria.proxy.sessions.conversation import Conversation, fingerprint
from talaria.proxy.sessions.resolve import resolve
from talaria.proxy.sessions.state import Resolution, SessionState
from talaria.proxy.sessions.tenancy import SessionLimit

NOW = datetime(2026, 12, 1, tzinfo=UTC)
IMPLICIT = Identity(None, "implicit")
REPLY = {"role": "assistant", "content": "done"}


def _messages(task: str, turns: int = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for i in range(turns):
        out += [REPLY, {"role": "user", "content": f"more {i}"}]
    return out


def _call(
    book: SessionBook,
    task: str,
    *,
    tenant: str = "A",
    identity: Identity = IMPLICIT,
    turns: int = 0,
    now_s: float = 0.0,
) -> Resolution:
    """One call of ``task``'s conversation (``turns`` further exchanges), answered ``REPLY``."""
    prompt = Conversation.of(_messages(task, turns))
    found = resolve(book,
        tenant_id=tenant, identity=identity, model="m", conversation=prompt, now_s=now_s,
        now_at=NOW,
    )  # fmt: skip
    book.call_started(found.state, prompt, now_s)
    book.call_finished(found.state, prompt, fingerprint(REPLY), now_s)
    book.call_ended(found.state, found.thread)
    return found


NAMED = Identity("task-1", "talaria")


@pytest.mark.parametrize(
    ("call", "how"),
    [
        ({"task": "t0", "turns": 1}, "continued"),  # an implicit session goes on
        ({"task": "t0"}, "retry"),
        ({"task": "named", "identity": NAMED, "turns": 1}, "continued"),
        ({"task": "t-new"}, None),  # a new implicit session
        ({"task": "t-new", "identity": Identity("task-2", "talaria")}, None),  # a new named one
        ({"task": "side", "identity": NAMED}, None),  # a new thread counts as a session
        ({"task": "sub", "identity": Identity("a-1", "claude-code", "task-1")}, None),  # a child
        ({"task": "t-new", "tenant": "B"}, "new"),  # another tenant
    ],
)
def test_at_the_cap_only_calls_that_open_a_session_are_refused(
    call: dict[str, Any], how: str | None
) -> None:
    book = SessionBook(max_per_tenant=2)
    _call(book, "t0", now_s=1.0)
    _call(book, "named", identity=NAMED, now_s=2.0)
    assert book.count("A") == 2
    if how is None:
        with pytest.raises(SessionLimit) as info:
            _call(book, now_s=3.0, **call)
        assert info.value.limit == 2
        assert info.value.oldest_activity_s == 1.0  # t0's session is the least recently used
        assert book.count("A") == 2
    else:
        assert _call(book, now_s=3.0, **call).how == how


def test_an_ended_session_frees_its_place_and_a_take_over_is_never_refused() -> None:
    book = SessionBook(max_per_tenant=1)
    first = _call(book, "t0").state
    with pytest.raises(SessionLimit):
        _call(book, "t1")
    book.forget(first)
    assert book.count("A") == 0
    second = _call(book, "t1").state
    adopted = SessionState(
        key="ses_adopted", tenant_id="A", session_id="x", identity_source="talaria",
        model="m", started_at=NOW, started_s=0.0, root_key="ses_adopted", adopted=True,
        calls=2,
    )  # fmt: skip
    assert not book.has_room("A")  # no claim of a new name (proxy/cluster/handoff.py)
    book.adopt(adopted)  # another replica's session, continued here
    assert book.count("A") == 2 and book.get(second.key) is second
    assert _call(book, "x", identity=Identity("x", "talaria")).how == "adopted"


def test_the_oldest_is_the_least_recently_used() -> None:
    book = SessionBook(max_per_tenant=2)
    _call(book, "t0", now_s=1.0)
    _call(book, "t1", now_s=2.0)
    _call(book, "t0", turns=1, now_s=5.0)  # t0 goes on: t1 is the least recent now
    with pytest.raises(SessionLimit) as info:
        _call(book, "t2", now_s=6.0)
    assert info.value.oldest_activity_s == 2.0
