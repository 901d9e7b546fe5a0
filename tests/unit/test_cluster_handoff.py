"""Hand-off of sessions the ingress placed (proxy/cluster/handoff.py, ingress affinity): once
the replicas change, the idle ones are forgotten (and taken over from the store if they come
back); one that another replica served since is never ended here. A real ``SessionBook``; the
store is a table of what ``adopt`` would find."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from talaria.core.clock import TimeScale
from talaria.core.reservations import SessionReservations
from talaria.proxy.cluster.handoff import AdoptableSession, Handoff
from talaria.proxy.cluster.owner import placement_key, route_key
from talaria.proxy.sessions.book import SessionBook
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
        self.sessions = SessionBook()
        owned = owned_here or set()
        self.handoff = Handoff(
            self.sessions,
            SessionReservations(),
            TimeScale(),
            owned=lambda key: key in owned,
            adopt=self._adopt,
            generation=lambda: self.generation,
        )

    async def _adopt(self, tenant: str, sid: str) -> AdoptableSession | None:
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
