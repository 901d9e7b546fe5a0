"""Sessions moving between proxy replicas when membership changes.

- *Take-over*: a call names a session this replica does not hold, but the store shows it open:
  another replica held it before this one became its owner. It is held here under the same
  key, with its call count and last instance, so that it goes on as one session.
- *Hand-off*: at each sweep, the sessions another replica owns now (one joined) are
  forgotten, without ending them: their calls go there, and that replica takes them over.
  Ending them would release their KV on the runtime under their new owner.

An implicit session (no client id) is not taken over: its next call starts a new session.

*First calls*: a call that names a root session no replica has opened yet *claims* the name
in the store before this replica opens it (proxy/store/claims.py): the store inserts the new
session's row, or, when another replica's claim came first, answers with that session, which
is then taken over here like any other. So concurrent first calls of one session on two
replicas make one session (issue 46), not two. A tenant at its cap of live sessions claims
nothing (the book refuses its new session: 429).

With ingress affinity (owner.py), the balancer, not this replica, decides where a session's
calls go, and it moves sessions when the replicas change. So:

- at the first sweep or call after the live set changed (``generation``), the idle sessions
  the ingress placed here are forgotten: if one comes back, it is taken over from the store as it
  stands (another replica may have served it meanwhile);
- before such a session is ended for idleness, the store is asked whether another replica
  served it since (more calls there than here): then it is forgotten, not ended, for ending it
  would release its KV under the replica that holds it now.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from talaria.core.clock import TimeScale
from talaria.core.preferences import SessionPreferences
from talaria.proxy.cluster.owner import placed_by_ingress
from talaria.proxy.contract.calls import PreparedCall
from talaria.proxy.contract.records import SessionRecord
from talaria.proxy.sessions.book import SessionBook
from talaria.proxy.sessions.state import SessionState, new_key


@dataclass(frozen=True)
class AdoptableSession:
    """An open session as the store shows it, for a replica that takes it over."""

    key: str
    model: str
    started_at: datetime
    calls: int
    last_instance: str | None


Owned = Callable[[str], bool]
"""``owned(route_key)``: whether this replica owns that session now."""


class Adopt(Protocol):
    """``adopt(tenant, client id)``: the open session another replica held, if any; with
    ``claim`` (a new session's record), that session, else ``claim``'s own, now in the store
    (proxy/store/claims.py)."""

    def __call__(
        self, tenant_id: str, session_id: str, claim: SessionRecord | None = None, /
    ) -> Awaitable[AdoptableSession | None]: ...


Generation = Callable[[], int]
"""How many times the live set of replicas has changed (membership.py)."""


class Handoff:
    """Take-over and hand-off of this replica's sessions (module docstring)."""

    def __init__(
        self,
        sessions: SessionBook,
        preferences: SessionPreferences,
        time: TimeScale,
        owned: Owned,
        adopt: Adopt,
        generation: Generation,
    ) -> None:
        self._sessions = sessions
        self._preferences = preferences
        self._time = time
        self._owned = owned
        self._adopt = adopt
        self._generation = generation
        self._seen = generation()

    async def take_over(self, call: PreparedCall, now_s: float) -> None:
        """Hold the session ``call`` names when another replica held it and this one does
        not yet (nothing happens for an implicit call or a session held here)."""
        if self._generation() != self._seen:  # not waiting for the sweep: this call may be one
            self.hand_off()
        sid = call.identity.session_id
        if sid is None or self._sessions.named(call.tenant_id, sid):
            return
        stored = await self._adopt(call.tenant_id, sid, self._claim(call, sid))
        if stored is None or self._sessions.named(call.tenant_id, sid):  # or a call of it did
            return
        age_s = (datetime.now(UTC) - stored.started_at).total_seconds()
        self._sessions.adopt(
            SessionState(
                key=stored.key,
                tenant_id=call.tenant_id,
                session_id=sid,
                identity_source=call.identity.source,
                agent=call.identity.agent,
                model=stored.model,
                started_at=stored.started_at,
                started_s=now_s - self._time.clock(max(0.0, age_s)),
                root_key=stored.key,
                calls=stored.calls,
                last_activity_s=now_s,
                last_instance=stored.last_instance,
                route_key=call.route_key,
                adopted=True,
            )
        )
        self._preferences.adopt(stored.key, stored.last_instance)

    def _claim(self, call: PreparedCall, sid: str) -> SessionRecord | None:
        """The record of the root session ``call`` would open under its name (module
        docstring); None for a child, or a tenant that may open no more sessions."""
        if call.identity.parent_session_id is not None:
            return None
        if not self._sessions.has_room(call.tenant_id):
            return None
        now = datetime.now(UTC)
        return SessionRecord(
            session_key=new_key(),
            tenant_id=call.tenant_id,
            model=call.model,
            started_at=now,
            last_call_at=now,
            session_id=sid,
            identity_source=call.identity.source,
            agent=call.identity.agent,
        )

    def hand_off(self) -> None:
        """Forget, without ending them, the idle sessions another replica owns now, and, once
        the live set changed, the idle ones the ingress placed here (module docstring)."""
        changed, self._seen = self._generation() != self._seen, self._generation()
        for state in list(self._sessions):
            key = state.route_key
            if key is None or state.inflight > 0:
                continue
            moved = changed if placed_by_ingress(key) else not self._owned(key)
            if moved:
                self._sessions.forget(state)

    async def served_elsewhere(self, state: SessionState) -> bool:
        """Whether another replica has served ``state`` since this one last did: an
        ingress-placed session the store shows with more calls (module docstring)."""
        if state.route_key is None or not placed_by_ingress(state.route_key):
            return False
        if state.identity_source == "implicit" or state.parent_key is not None:
            return False  # only a root session with a client id is taken over (take_over)
        stored = await self._adopt(state.tenant_id, state.session_id)
        return stored is not None and stored.key == state.key and stored.calls > state.calls
