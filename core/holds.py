"""The node's holds (the ``soft_reservations`` flag; the wire, the records and the replay
document still say "reservation"): a session in a tool gap keeps its KV and some admission
budget on the node it last ran on, until it returns, ends, or the hold expires.

The runtime's node scheduler keeps a ``HoldTable`` of ``plan_hold``s. (What the proxy keeps,
which instance a session in a tool gap is expected back on, is a route preference:
core/preferences.py.)

Expected gap = the caller's hint if given, else the session's learned mean gap
(core/gap_model.py ``MeanGaps``: ``(prior_s × prior_weight + Σ observed) / (prior_weight + n)``,
prior the tool-gap mean ≈ 3.2 s of docs/sources.md §2, weight 1 observation; est.). A
hold is taken only if the session is expected back before the slot's deadline (there is
no point holding a slot it will miss), and expires at ``now + max(slack_factor × gap, gap +
min_slack_s)`` (the *slack rule*, ``core.gap_model.slack_hold_s``). With the ``learned_gaps``
scheduler flag the node passes, for a session without a hint, the q-quantile of its learned
log-normal gap as ``hold_gap_s`` (core/gap_model.py ``LogNormalGaps``): the hold then
keeps the session's KV until ``now + max(hold_gap_s, slack rule)``, but its model's slot open,
and the admission budget for the session's next call (``held_bytes``), only for the slack
rule (``Hold.slot_until_s``). A live hold stops the slot's idle close
(runtime/scheduling/slots.py), so holding the slot longer would keep other models waiting, and
a budget held longer turns other calls away (docs/results.md §12 measured both); the extension
keeps only the session's KV pinned, bytes that are resident already.

Memory held, per release with a time: the budget, ``held_bytes`` × (min(release,
``slot_until_s``) − created) (``HoldTable.held_byte_s``), and the pinned KV,
``pinned_bytes`` × (release − created) (``pinned_byte_s``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from talaria.core.gap_model import (
    MIN_SLACK_S,
    SLACK_FACTOR,
    slack_hold_s,
)

DEFAULT_MAX_HINT_GAP_S = 240.0
"""The longest tool gap a client's hint may claim (a longer one counts as this): above the p99
of real coding-agent tool calls, 3.6 min (TraceLab, docs/sources.md §2), in whole minutes. A
hinted hold then expires within 2 × 240 s = 8 min, before the 600 s idle timeout ends the
session."""


class ReleaseReason(StrEnum):
    """Why a node's hold was released (the node counts each)."""

    RETURNED = "returned"
    ENDED = "ended"
    EXPIRED = "expired"
    SLOT_CLOSED = "slot-closed"
    MOVED = "moved"  # the session's next call went to another instance
    OVER_SHARE = "over-share"  # another tenant's call needed the memory past its tenant's share
    STALE = "stale"  # another tenant's call needed the memory; held past a few mean gaps


@dataclass(frozen=True)
class Hold:
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


def plan_hold(
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
) -> Hold | None:
    """The hold to take after a call that ends in a tool gap, or None (rules above);
    ``hold_gap_s``, when given, extends how long it is held to at least that, and the slack
    rule then bounds how long it keeps the slot open and its budget."""
    expected_return = now_s + expected_gap_s
    if deadline_s is not None and expected_return > deadline_s:
        return None
    slack = slack_hold_s(expected_gap_s, slack_factor, min_slack_s)
    if hold_gap_s is None:
        return Hold(
            session_key, model, held_bytes, now_s, expected_return, now_s + slack,
            pinned_bytes=pinned_bytes,
        )  # fmt: skip
    return Hold(
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
class HoldTable:
    """A node's live holds by session, how many were released for each reason, and the
    memory they held, byte-seconds over the releases that gave their time (module docstring):
    the budget, Σ held_bytes × (min(release, slot_until_s) − creation), and the pinned KV,
    Σ pinned_bytes × (release − creation)."""

    live: dict[str, Hold] = field(default_factory=dict)
    released: dict[ReleaseReason, int] = field(
        default_factory=lambda: dict.fromkeys(ReleaseReason, 0)
    )
    held_byte_s: float = 0.0
    pinned_byte_s: float = 0.0

    def add(self, reservation: Hold) -> None:
        """Hold ``reservation`` (replacing the session's previous one, uncounted)."""
        self.live[reservation.session_key] = reservation

    def release(
        self, session_key: str, reason: ReleaseReason, now_s: float | None = None
    ) -> Hold | None:
        """Drop the session's hold, counting ``reason`` (and, given ``now_s``, its
        held bytes × the seconds it was held); the one dropped, or None."""
        found = self.live.pop(session_key, None)
        if found is not None:
            self.released[reason] += 1
            if now_s is not None:
                budget_end = now_s if found.slot_until_s is None else min(now_s, found.slot_until_s)
                self.held_byte_s += found.held_bytes * max(0.0, budget_end - found.created_s)
                self.pinned_byte_s += found.pinned_bytes * max(0.0, now_s - found.created_s)
        return found

    def expired(self, now_s: float) -> list[Hold]:
        """The holds whose expiry is at or before ``now_s`` (not released here)."""
        return [r for r in self.live.values() if r.expires_s <= now_s]

    def for_model(self, model: str) -> list[Hold]:
        """The live holds of sessions on ``model``."""
        return [r for r in self.live.values() if r.model == model]

    def keeping_slot(self, model: str, now_s: float) -> int:
        """How many live holds on ``model`` keep its slot open at ``now_s``."""
        return sum(1 for r in self.live.values() if r.model == model and r.keeps_slot(now_s))

    def held_bytes(
        self,
        exclude_session: str | None = None,
        counts: Callable[[str], bool] | None = None,
        now_s: float | None = None,
    ) -> float:
        """Bytes held by live holds, leaving out ``exclude_session``'s own, given
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
        holds, seconds; None when there is none."""
        times = [r.expires_s for r in self.live.values()]
        times += [t for r in self.live.values() if (t := r.slot_until_s) is not None and t > now_s]
        return min(times, default=None)
