"""Route preferences (the proxy's; the simulator's cluster replay keeps the same book): a
session in a tool gap prefers the instance its last call ran on, so that its next call finds
its KV there; the router's ``reserved`` rule reads it (the name the wire, the records and the
routing reasons keep). Its expiry is the node's hold rule without a slot deadline
(core/holds.py ``plan_hold``); the gaps are learned with the mean rule (core/gap_model.py
``MeanGaps``).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from enum import StrEnum

from talaria.core.gap_model import MeanGaps
from talaria.core.holds import plan_hold


class Settled(StrEnum):
    """How a session's route preference ended when the session came back."""

    HIT = "hit"
    """Back while it was live, and routed to the reserved instance."""
    MISS = "miss"
    """Back while it was live, but routed to another instance."""
    EXPIRED = "expired"
    """Back after it expired (and before a sweep released it)."""


@dataclass(frozen=True)
class RoutePreference:
    """A route preference: ``session``'s next call is expected on ``instance``.
    ``session`` is the proxy's session key (a trace's session id in the cluster replay); times
    are seconds of the caller's clock."""

    session: str
    instance: str
    created_s: float
    expected_gap_s: float
    expires_s: float

    @property
    def expected_return_s(self) -> float:
        """When the session is expected back, seconds: created_s + expected_gap_s."""
        return self.created_s + self.expected_gap_s

    def live(self, now_s: float) -> bool:
        """Live up to and including its expiry instant."""
        return now_s <= self.expires_s


@dataclass
class _Tracked:
    gaps: MeanGaps = field(default_factory=MeanGaps)
    last_finish_s: float | None = None
    """The finish of its last call, until its next call starts (one gap per finish)."""
    last_instance: str | None = None
    held: RoutePreference | None = None


class SessionPreferences:
    """Route preferences and tool-gap learning, per session key (one book per proxy
    process; the gateway's and the simulator's cluster replay's). Pure: no clock, no I/O; every
    time is an argument, in seconds of the caller's clock.

    Rules:

    - **Gap learning.** A call that starts (``started``) while no other call of the session is
      in flight observes the gap since the session's last finish, once per finish
      (``core.gap_model.MeanGaps``: the prior 3.2 s with weight 1, then the mean of what was
      observed).
    - **When to reserve.** After a call that is not the session's last (``finished``) whose reply
      asks for tools, or that carries a client tool-gap hint; a hint on its own (``hint``, no
      call of the session in flight) reserves too. A reply that neither asks for tools nor
      carries a hint leaves any preference as it is; a new one replaces the old.
    - **Where and for how long.** On the instance of the session's last call (for a call: the
      instance that ran it). The expected gap is the hint when one is given, else the learned
      mean; the preference expires at ``now + max(2 × gap, gap + 1 s)``
      (``plan_hold`` with no slot deadline: the proxy does not see slots).
    - **Reading.** ``reserved(session, now)`` is the instance while ``now ≤ expiry``, else None;
      reading never releases.
    - **Settling.** The session's next call (``started``) releases its preference:
      ``HIT`` if live and routed to its instance, ``MISS`` if live and routed elsewhere,
      ``EXPIRED`` if past its expiry.
    - **Expiry.** ``sweep(now)`` releases and returns the preferences past their expiry.
    - **Ends.** A session's last call and ``end`` drop everything the book holds of it.
    """

    def __init__(self) -> None:
        self._sessions: dict[str, _Tracked] = {}
        self._expiries: list[tuple[float, str, int, RoutePreference]] = []
        """(expiry, session, number, preference) of each preference taken: ``sweep`` pops the
        expired ones (a released or replaced one is skipped then), so it walks no live ones."""
        self._taken = itertools.count()

    def __contains__(self, session: object) -> bool:
        """Whether the book holds anything of ``session`` (learned gaps, a preference)."""
        return session in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)

    # -- reading ----------------------------------------------------------------------------
    def reserved(self, session: str, now_s: float) -> str | None:
        """The instance of the session's live preference; None if none, or expired."""
        held = self.held(session)
        return held.instance if held is not None and held.live(now_s) else None

    def held(self, session: str) -> RoutePreference | None:
        """The session's preference, live or expired but not yet released."""
        tracked = self._sessions.get(session)
        return None if tracked is None else tracked.held

    def expected_gap_s(self, session: str) -> float:
        """The session's learned mean gap (the prior for a session the book does not know)."""
        tracked = self._sessions.get(session)
        return (tracked.gaps if tracked is not None else MeanGaps()).expected_s()

    # -- a session's calls ------------------------------------------------------------------
    def started(
        self, session: str, instance: str, now_s: float, *, concurrent: bool = False
    ) -> Settled | None:
        """A call of the session starts on ``instance``: learn the gap since its last finish
        (not when ``concurrent``: another of its calls is in flight, so this is no tool gap),
        and release its preference. Returns how the preference ended (None: it had none)."""
        tracked = self._sessions.get(session)
        if tracked is None:
            return None
        if tracked.last_finish_s is not None and not concurrent:
            tracked.gaps.observe(now_s - tracked.last_finish_s)
            tracked.last_finish_s = None
        held, tracked.held = tracked.held, None
        if held is None:
            return None
        if not held.live(now_s):
            return Settled.EXPIRED
        return Settled.HIT if held.instance == instance else Settled.MISS

    def finished(
        self,
        session: str,
        instance: str,
        now_s: float,
        *,
        final: bool,
        asks_tools: bool,
        hint_s: float | None = None,
    ) -> RoutePreference | None:
        """A call of the session ended on ``instance`` at ``now_s``. Its last (``final``): the
        session is forgotten. Else its finish is remembered (for the next gap), and if the reply
        asks for tools or the call carried a tool-gap hint (``hint_s``), a preference on
        ``instance`` is taken (replacing any); returns it (None: none taken)."""
        if final:
            self._sessions.pop(session, None)
            return None
        tracked = self._sessions.setdefault(session, _Tracked())
        tracked.last_finish_s = now_s
        tracked.last_instance = instance
        if not asks_tools and hint_s is None:
            return None
        return self._reserve(session, tracked, instance, now_s, hint_s)

    def hint(
        self, session: str, now_s: float, gap_s: float, *, concurrent: bool = False
    ) -> RoutePreference | None:
        """The client expects a tool gap of ``gap_s``: reserve on the instance of the session's
        last call (replacing any preference). None, and nothing reserved, when the book knows
        no last instance or a call of the session is in flight (``concurrent``)."""
        tracked = self._sessions.get(session)
        if tracked is None or tracked.last_instance is None or concurrent:
            return None
        return self._reserve(session, tracked, tracked.last_instance, now_s, gap_s)

    def adopt(self, session: str, last_instance: str | None) -> None:
        """A session this book never saw goes on here (a proxy replica takes it over): its
        last call ran on ``last_instance``. Nothing is learned or reserved."""
        tracked = self._sessions.setdefault(session, _Tracked())
        if tracked.last_instance is None:
            tracked.last_instance = last_instance

    def _reserve(
        self,
        session: str,
        tracked: _Tracked,
        instance: str,
        now_s: float,
        hint_s: float | None,
    ) -> RoutePreference:
        gap = hint_s if hint_s is not None else tracked.gaps.expected_s()
        plan = plan_hold(
            session_key=session,
            model="",
            now_s=now_s,
            expected_gap_s=gap,
            held_bytes=0.0,
            deadline_s=None,
        )
        assert plan is not None  # no deadline: always planned
        tracked.held = RoutePreference(session, instance, now_s, gap, plan.expires_s)
        heapq.heappush(self._expiries, (plan.expires_s, session, next(self._taken), tracked.held))
        if len(self._expiries) > 2 * len(self._sessions) + 1024:  # mostly released: compact
            self._expiries = [e for e in self._expiries if self._holds(e[3])]
            heapq.heapify(self._expiries)
        return tracked.held

    def _holds(self, held: RoutePreference) -> bool:
        tracked = self._sessions.get(held.session)
        return tracked is not None and tracked.held is held

    # -- expiry and ends --------------------------------------------------------------------
    def sweep(self, now_s: float) -> list[RoutePreference]:
        """Release the preferences past their expiry at ``now_s``; returns them (by expiry,
        then session). A walk of the expired ones only (issue 46)."""
        expired = []
        while self._expiries and not self._expiries[0][3].live(now_s):
            held = heapq.heappop(self._expiries)[3]
            if self._holds(held):
                self._sessions[held.session].held = None
                expired.append(held)
        return expired

    def end(self, session: str) -> RoutePreference | None:
        """The session ended (or this process no longer serves it): forget it; returns the
        preference it held, if any (live or not)."""
        tracked = self._sessions.pop(session, None)
        return None if tracked is None else tracked.held
