"""Soft reservations (shared by the runtime's admission and the proxy's routing): a session in a
tool gap keeps its KV and some admission budget on the node
it last ran on, until it returns, ends, or the reservation expires.

The runtime's node scheduler keeps a ``ReservationTable`` of ``plan_reservation``s; the proxy
(the gateway, and the simulator's cluster replay) keeps one ``SessionReservations``: which
instance each session in a tool gap is expected back on, for the router's ``reserved`` rule.

Expected gap = the caller's hint if given, else the session's learned mean gap
(core/gap_model.py ``MeanGaps``: ``(prior_s × prior_weight + Σ observed) / (prior_weight + n)``,
prior the tool-gap mean ≈ 3.2 s of docs/sources.md §2, weight 1 observation; est.). A
reservation is taken only if the session is expected back before the slot's deadline (there is
no point holding a slot it will miss), and expires at ``now + max(slack_factor × gap, gap +
min_slack_s)`` (the *slack rule*, ``core.gap_model.slack_hold_s``). With the ``learned_gaps``
scheduler flag the node passes, for a session without a hint, the q-quantile of its learned
log-normal gap as ``hold_gap_s`` (core/gap_model.py ``LogNormalGaps``): the reservation then
holds the session's KV until ``now + max(hold_gap_s, slack rule)``, but keeps its model's slot
open, and the admission budget for the session's next call (``held_bytes``), only for the slack
rule (``Reservation.slot_until_s``). A live reservation stops the slot's idle close
(runtime/scheduling/slots.py), so holding the slot longer would keep other models waiting, and
a budget held longer turns other calls away (docs/results.md §12 measured both); the extension
keeps only the session's KV pinned, bytes that are resident already.

Memory held, per release with a time: the budget, ``held_bytes`` × (min(release,
``slot_until_s``) − created) (``ReservationTable.held_byte_s``), and the pinned KV,
``pinned_bytes`` × (release − created) (``pinned_byte_s``).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from talaria.core.gap_model import (
    MIN_SLACK_S,
    SLACK_FACTOR,
    MeanGaps,
    slack_hold_s,
)

DEFAULT_MAX_HINT_GAP_S = 240.0
"""The longest tool gap a client's hint may claim (a longer one counts as this): above the p99
of real coding-agent tool calls, 3.6 min (TraceLab, docs/sources.md §2), in whole minutes. A
hinted hold then expires within 2 × 240 s = 8 min, before the 600 s idle timeout ends the
session."""


class ReleaseReason(StrEnum):
    """Why a node's reservation was released (the node counts each)."""

    RETURNED = "returned"
    ENDED = "ended"
    EXPIRED = "expired"
    SLOT_CLOSED = "slot-closed"
    MOVED = "moved"  # the session's next call went to another instance
    OVER_SHARE = "over-share"  # another tenant's call needed the memory past its tenant's share
    STALE = "stale"  # another tenant's call needed the memory; held past a few mean gaps


@dataclass(frozen=True)
class Reservation:
    """A node's hold on a session's KV and admission budget during its tool gap. ``session_key``
    is the runtime's session (the proxy's session key; a trace's session id in a replay);
    times are seconds of the node's clock, ``held_bytes`` bytes of HBM."""

    session_key: str
    model: str
    held_bytes: float
    created_s: float
    expected_return_s: float
    expires_s: float
    slot_until_s: float | None = None
    """Until when it keeps its model's contended slot from closing idle (runtime/scheduling/
    slots.py ``close_reason``) and holds ``held_bytes`` of admission budget; None: for as long as
    it lives."""
    pinned_bytes: float = 0.0
    """The session's KV it keeps pinned in HBM (resident already, not held for what follows)."""

    def keeps_slot(self, now_s: float) -> bool:
        """Whether it still keeps its model's slot open at ``now_s``."""
        return self.slot_until_s is None or now_s < self.slot_until_s


def plan_reservation(
    *,
    session_key: str,
    model: str,
    now_s: float,
    expected_gap_s: float,
    held_bytes: float,
    deadline_s: float | None,
    slack_factor: float = SLACK_FACTOR,
    min_slack_s: float = MIN_SLACK_S,
    hold_gap_s: float | None = None,
    pinned_bytes: float = 0.0,
) -> Reservation | None:
    """The reservation to take after a call that ends in a tool gap, or None (rules above);
    ``hold_gap_s``, when given, extends how long it is held to at least that, and the slack
    rule then bounds how long it keeps the slot open and its budget."""
    expected_return = now_s + expected_gap_s
    if deadline_s is not None and expected_return > deadline_s:
        return None
    slack = slack_hold_s(expected_gap_s, slack_factor, min_slack_s)
    if hold_gap_s is None:
        return Reservation(
            session_key, model, held_bytes, now_s, expected_return, now_s + slack,
            pinned_bytes=pinned_bytes,
        )  # fmt: skip
    return Reservation(
        session_key,
        model,
        held_bytes,
        now_s,
        expected_return,
        now_s + max(hold_gap_s, slack),
        now_s + slack,
        pinned_bytes,
    )


@dataclass
class ReservationTable:
    """A node's live reservations by session, how many were released for each reason, and the
    memory they held, byte-seconds over the releases that gave their time (module docstring):
    the budget, Σ held_bytes × (min(release, slot_until_s) − creation), and the pinned KV,
    Σ pinned_bytes × (release − creation)."""

    live: dict[str, Reservation] = field(default_factory=dict)
    released: dict[ReleaseReason, int] = field(
        default_factory=lambda: dict.fromkeys(ReleaseReason, 0)
    )
    held_byte_s: float = 0.0
    pinned_byte_s: float = 0.0

    def add(self, reservation: Reservation) -> None:
        """Hold ``reservation`` (replacing the session's previous one, uncounted)."""
        self.live[reservation.session_key] = reservation

    def release(
        self, session_key: str, reason: ReleaseReason, now_s: float | None = None
    ) -> Reservation | None:
        """Drop the session's reservation, counting ``reason`` (and, given ``now_s``, its
        held bytes × the seconds it was held); the one dropped, or None."""
        found = self.live.pop(session_key, None)
        if found is not None:
            self.released[reason] += 1
            if now_s is not None:
                budget_end = now_s if found.slot_until_s is None else min(now_s, found.slot_until_s)
                self.held_byte_s += found.held_bytes * max(0.0, budget_end - found.created_s)
                self.pinned_byte_s += found.pinned_bytes * max(0.0, now_s - found.created_s)
        return found

    def expired(self, now_s: float) -> list[Reservation]:
        """The reservations whose expiry is at or before ``now_s`` (not released here)."""
        return [r for r in self.live.values() if r.expires_s <= now_s]

    def for_model(self, model: str) -> list[Reservation]:
        """The live reservations of sessions on ``model``."""
        return [r for r in self.live.values() if r.model == model]

    def keeping_slot(self, model: str, now_s: float) -> int:
        """How many live reservations on ``model`` keep its slot open at ``now_s``."""
        return sum(1 for r in self.live.values() if r.model == model and r.keeps_slot(now_s))

    def held_bytes(
        self,
        exclude_session: str | None = None,
        counts: Callable[[str], bool] | None = None,
        now_s: float | None = None,
    ) -> float:
        """Bytes held by live reservations, leaving out ``exclude_session``'s own, given
        ``counts`` (a session key → whether its hold counts) those it refuses, and, given
        ``now_s``, those past keeping their slot (a learned hold's extension keeps the session's
        KV, not a budget for its next call)."""
        return sum(
            r.held_bytes
            for r in self.live.values()
            if r.session_key != exclude_session
            and (counts is None or counts(r.session_key))
            and (now_s is None or r.keeps_slot(now_s))
        )

    def next_change_s(self, now_s: float) -> float | None:
        """The earliest expiry, or end of keeping a slot open after ``now_s``, among the live
        reservations, seconds; None when there is none."""
        times = [r.expires_s for r in self.live.values()]
        times += [t for r in self.live.values() if (t := r.slot_until_s) is not None and t > now_s]
        return min(times, default=None)


class Settled(StrEnum):
    """How a session's proxy-level reservation ended when the session came back."""

    HIT = "hit"
    """Back while it was live, and routed to the reserved instance."""
    MISS = "miss"
    """Back while it was live, but routed to another instance."""
    EXPIRED = "expired"
    """Back after it expired (and before a sweep released it)."""


@dataclass(frozen=True)
class SoftReservation:
    """A proxy-level soft reservation: ``session``'s next call is expected on ``instance``.
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
    held: SoftReservation | None = None


class SessionReservations:
    """Proxy-level soft reservations and tool-gap learning, per session key (one book per proxy
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
      carries a hint leaves any reservation as it is; a new one replaces the old.
    - **Where and for how long.** On the instance of the session's last call (for a call: the
      instance that ran it). The expected gap is the hint when one is given, else the learned
      mean; the reservation expires at ``now + max(2 × gap, gap + 1 s)``
      (``plan_reservation`` with no slot deadline: the proxy does not see slots).
    - **Reading.** ``reserved(session, now)`` is the instance while ``now ≤ expiry``, else None;
      reading never releases.
    - **Settling.** The session's next call (``started``) releases its reservation:
      ``HIT`` if live and routed to its instance, ``MISS`` if live and routed elsewhere,
      ``EXPIRED`` if past its expiry.
    - **Expiry.** ``sweep(now)`` releases and returns the reservations past their expiry.
    - **Ends.** A session's last call and ``end`` drop everything the book holds of it.
    """

    def __init__(self) -> None:
        self._sessions: dict[str, _Tracked] = {}
        self._expiries: list[tuple[float, str, int, SoftReservation]] = []
        """(expiry, session, number, reservation) of each reservation taken: ``sweep`` pops the
        expired ones (a released or replaced one is skipped then), so it walks no live ones."""
        self._taken = itertools.count()

    def __contains__(self, session: object) -> bool:
        """Whether the book holds anything of ``session`` (learned gaps, a reservation)."""
        return session in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)

    # -- reading ----------------------------------------------------------------------------
    def reserved(self, session: str, now_s: float) -> str | None:
        """The instance of the session's live reservation; None if none, or expired."""
        held = self.held(session)
        return held.instance if held is not None and held.live(now_s) else None

    def held(self, session: str) -> SoftReservation | None:
        """The session's reservation, live or expired but not yet released."""
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
        and release its reservation. Returns how the reservation ended (None: it had none)."""
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
    ) -> SoftReservation | None:
        """A call of the session ended on ``instance`` at ``now_s``. Its last (``final``): the
        session is forgotten. Else its finish is remembered (for the next gap), and if the reply
        asks for tools or the call carried a tool-gap hint (``hint_s``), a reservation on
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
    ) -> SoftReservation | None:
        """The client expects a tool gap of ``gap_s``: reserve on the instance of the session's
        last call (replacing any reservation). None, and nothing reserved, when the book knows
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
    ) -> SoftReservation:
        gap = hint_s if hint_s is not None else tracked.gaps.expected_s()
        plan = plan_reservation(
            session_key=session,
            model="",
            now_s=now_s,
            expected_gap_s=gap,
            held_bytes=0.0,
            deadline_s=None,
        )
        assert plan is not None  # no deadline: always planned
        tracked.held = SoftReservation(session, instance, now_s, gap, plan.expires_s)
        heapq.heappush(self._expiries, (plan.expires_s, session, next(self._taken), tracked.held))
        if len(self._expiries) > 2 * len(self._sessions) + 1024:  # mostly released: compact
            self._expiries = [e for e in self._expiries if self._holds(e[3])]
            heapq.heapify(self._expiries)
        return tracked.held

    def _holds(self, held: SoftReservation) -> bool:
        tracked = self._sessions.get(held.session)
        return tracked is not None and tracked.held is held

    # -- expiry and ends --------------------------------------------------------------------
    def sweep(self, now_s: float) -> list[SoftReservation]:
        """Release the reservations past their expiry at ``now_s``; returns them (by expiry,
        then session). A walk of the expired ones only (issue 46)."""
        expired = []
        while self._expiries and not self._expiries[0][3].live(now_s):
            held = heapq.heappop(self._expiries)[3]
            if self._holds(held):
                self._sessions[held.session].held = None
                expired.append(held)
        return expired

    def end(self, session: str) -> SoftReservation | None:
        """The session ended (or this process no longer serves it): forget it; returns the
        reservation it held, if any (live or not)."""
        tracked = self._sessions.pop(session, None)
        return None if tracked is None else tracked.held
