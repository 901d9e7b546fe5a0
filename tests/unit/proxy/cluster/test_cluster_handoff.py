"""Hand-off of sessions the ingress placed (proxy/cluster/handoff.py, ingress affinity): once
the replicas change, the idle ones are forgotten (and taken over from the store if they come
back); one that another replica served since is never ended here. A real ``SessionBook``; the
store is a table of what ``adopt`` would find."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from talaria.core.calls import Call
from talaria.core.clock import TimeScale
from talaria.core.preferences import SessionPreferences
from talaria.proxy.cluster.handoff import AdoptableSession, Handoff
from talaria.proxy.cluster.owner import placement_key, route_key
from talaria.proxy.contract.calls import PreparedCall
from talaria.proxy.contract.identity import Identity
from talaria.proxy.contract.records import SessionRecord
from talaria.proxy.sessions.book import SessionBook
from talaria.proxy.sessions.conversation import Conversation
from talaria.proxy.sessions.resolve import resolve
from talaria.proxy.sessions.state import SessionState

STARTED = datetime(2026, 12, 3, tzinfo=UTC)


def _state(name: str, *, ingress: bool, calls: int = 3, inflight: int = 0) -> SessionState:
    headers = {"x-claude-code-session-id": name}
    key = placement_key("t", name, None, headers, ingress=ingress)
    return SessionState(
        key=f"ses_{name}",
        tenant_id="t",
        session_id=name,
        identity_source="claude-code",
        model="m",
        started_at=STARTED,
        started_s=0.0,
        root_key=f"ses_{name}",
        calls=calls,
        inflight=inflight,
        route_key=key,
    )


class World:
    def __init__(self, owned_here: set[str] | None = None) -> None:
        self.generation = 0
        self.stored: dict[str, AdoptableSession] = {}
        self.claims: list[SessionRecord | None] = []
        self.sessions = SessionBook()
        owned = owned_here or set()
        self.handoff = Handoff(
            self.sessions,
            SessionPreferences(),
            TimeScale(),
            owned=lambda key: key in owned,
            adopt=self._adopt,
            generation=lambda: self.generation,
        )

    async def _adopt(
        self, tenant: str, sid: str, claim: SessionRecord | None = None
    ) -> AdoptableSession | None:
        self.claims.append(claim)
        return self.stored.get(sid)

    def hold(self, *states: SessionState) -> None:
        for state in states:
            self.sessions.adopt(state)

    def held(self) -> set[str]:
        return {s.session_id for s in self.sessions}


def test_placement_keys() -> None:
    headers = {"session-id": "abc"}
    assert placement_key("t", "abc", None, headers, ingress=True) == "ingress|t|abc"
    assert placement_key("t", "abc", None, headers, ingress=False) == route_key("t", "abc", None)
    # no affinity header: placed by rendezvous even in ingress mode (the balancer spread it)
    assert placement_key("t", "abc", None, {}, ingress=True) == route_key("t", "abc", None)


def test_idle_ingress_sessions_are_forgotten_only_when_the_replicas_change() -> None:
    rendezvous = _state("r", ingress=False)
    idle, busy = _state("idle", ingress=True), _state("busy", ingress=True, inflight=1)
    world = World(owned_here={rendezvous.route_key or ""})
    world.hold(rendezvous, idle, busy)
    world.handoff.hand_off()
    assert world.held() == {"r", "idle", "busy"}  # nothing changed: all kept
    world.generation += 1
    world.handoff.hand_off()
    assert world.held() == {"r", "busy"}  # the idle ingress one went; the busy one stays
    busy.inflight = 0
    world.handoff.hand_off()
    assert world.held() == {"r", "busy"}  # once per change: it served its call here


@pytest.mark.parametrize(
    ("stored_calls", "same_key", "elsewhere"),
    [
        (5, True, True),  # two more calls were served by another replica
        (3, True, False),  # the store agrees with this replica
        (None, True, False),  # not open in the store
        (5, False, False),  # another session under that id (a new one): not this one's
    ],
)
def test_served_elsewhere(stored_calls: int | None, same_key: bool, elsewhere: bool) -> None:
    state = _state("s", ingress=True, calls=3)
    world = World()
    if stored_calls is not None:
        key = state.key if same_key else "ses_other"
        world.stored["s"] = AdoptableSession(key, "m", STARTED, stored_calls, "node-a")
    assert asyncio.run(world.handoff.served_elsewhere(state)) is elsewhere


def test_a_rendezvous_session_is_never_asked_about() -> None:
    state = _state("s", ingress=False, calls=3)
    world = World()
    world.stored["s"] = AdoptableSession(state.key, "m", STARTED, 9, "node-a")
    assert asyncio.run(world.handoff.served_elsewhere(state)) is False


# -- first calls: the store decides who opens a name (proxy/store/claims.py) ---------------
def _first_call(sid: str, parent: str | None = None) -> PreparedCall:
    return PreparedCall(
        request_id=f"r-{sid}",
        tenant_id="t",
        identity=Identity(sid, "claude-code", parent, agent="claude-cli"),
        api="chat",
        content=Call(model="m", messages=({"role": "user", "content": "go"},)),
        max_tokens=8,
    )


def _resolve(world: World, call: PreparedCall) -> str:
    conversation = Conversation.of(call.content.messages or ())
    found = resolve(
        world.sessions,
        tenant_id="t",
        identity=call.identity,
        model="m",
        conversation=conversation,
        now_s=1.0,
        now_at=STARTED,
    )
    return f"{found.state.key} {found.how}"


@pytest.mark.parametrize("winner", [None, "ses_theirs"], ids=["won", "lost"])
def test_a_first_call_claims_its_name_and_opens_the_session_the_store_answers(
    winner: str | None,
) -> None:
    """Won: the store answers with the claim's own session (no call yet), opened here under
    the claimed key as a new session. Lost: another replica's claim came first; its session
    is taken over, and the call is that session's first here (still new: no call recorded)."""
    world = World()
    call = _first_call("s")

    async def claimed(tenant: str, sid: str, claim: SessionRecord | None = None) -> Any:
        assert claim is not None and claim.session_id == "s" and claim.tenant_id == "t"
        assert claim.agent == "claude-cli" and claim.identity_source == "claude-code"
        return AdoptableSession(winner or claim.session_key, "m", STARTED, 0, None)

    world.handoff._adopt = claimed
    asyncio.run(world.handoff.take_over(call, 1.0))
    (state,) = world.sessions
    assert state.key.startswith("ses_") and state.calls == 0
    assert winner is None or state.key == winner
    assert _resolve(world, call) == f"{state.key} new"


def test_a_child_or_a_tenant_at_its_cap_claims_nothing() -> None:
    world = World()
    asyncio.run(world.handoff.take_over(_first_call("kid", parent="s"), 1.0))
    world.sessions = full = SessionBook(max_per_tenant=1)
    world.handoff._sessions = full
    _resolve(world, _first_call("other"))  # its one thread fills the tenant's cap
    asyncio.run(world.handoff.take_over(_first_call("s"), 1.0))
    assert world.claims == [None, None]
    assert world.held() == {"other"}  # nothing stored: the book opens (or refuses) it


def test_a_session_taken_over_with_calls_continues_as_adopted() -> None:
    world = World()
    world.stored["s"] = AdoptableSession("ses_s", "m", STARTED, 4, "node-a")
    asyncio.run(world.handoff.take_over(_first_call("s"), 1.0))
    assert world.claims[0] is not None  # asked with a claim; the store had one open
    assert _resolve(world, _first_call("s")) == "ses_s adopted"
