"""Soft reservations (shared by the runtime's admission and the proxy's routing): a session in a
tool gap keeps its KV and some admission budget on the node
it last ran on, until it returns, ends, or the reservation expires.

Expected gap = the caller's hint if given, else the session's learned mean gap
``(prior_s × prior_weight + Σ observed) / (prior_weight + n)`` (prior: the tool-gap mean
≈ 3.2 s of docs/sources.md §2, weight 1 observation; est.). A reservation is taken only if the
session is expected back before the slot's deadline (there is no point holding a slot it will
miss), and expires at ``now + max(slack_factor × gap, gap + min_slack_s)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

DEFAULT_GAP_PRIOR_S = 3.2
"""docs/sources.md §2: the fitted tool-gap mixture has mean ≈ 3.2 s."""


class ReleaseReason(StrEnum):
    RETURNED = "returned"
    ENDED = "ended"
    EXPIRED = "expired"
    SLOT_CLOSED = "slot-closed"
    MOVED = "moved"  # the session's next call went to another instance


@dataclass
class GapEstimator:
    prior_s: float = DEFAULT_GAP_PRIOR_S
    prior_weight: float = 1.0
    total_s: float = 0.0
    count: int = 0

    def observe(self, gap_s: float) -> None:
        self.total_s += max(0.0, gap_s)
        self.count += 1

    def expected_s(self) -> float:
        return (self.prior_s * self.prior_weight + self.total_s) / (self.prior_weight + self.count)


@dataclass(frozen=True)
class Reservation:
    session_id: str
    model: str
    held_bytes: float
    created_s: float
    expected_return_s: float
    expires_s: float


def plan_reservation(
    *,
    session_id: str,
    model: str,
    now_s: float,
    expected_gap_s: float,
    held_bytes: float,
    deadline_s: float | None,
    slack_factor: float = 2.0,
    min_slack_s: float = 1.0,
) -> Reservation | None:
    """The reservation to take after a call that ends in a tool gap, or None (rules above)."""
    expected_return = now_s + expected_gap_s
    if deadline_s is not None and expected_return > deadline_s:
        return None
    hold = max(slack_factor * expected_gap_s, expected_gap_s + min_slack_s)
    return Reservation(session_id, model, held_bytes, now_s, expected_return, now_s + hold)


@dataclass
class ReservationTable:
    live: dict[str, Reservation] = field(default_factory=dict)
    released: dict[ReleaseReason, int] = field(
        default_factory=lambda: dict.fromkeys(ReleaseReason, 0)
    )

    def add(self, reservation: Reservation) -> None:
        self.live[reservation.session_id] = reservation

    def release(self, session_id: str, reason: ReleaseReason) -> Reservation | None:
        found = self.live.pop(session_id, None)
        if found is not None:
            self.released[reason] += 1
        return found

    def expired(self, now_s: float) -> list[Reservation]:
        return [r for r in self.live.values() if r.expires_s <= now_s]

    def for_model(self, model: str) -> list[Reservation]:
        return [r for r in self.live.values() if r.model == model]

    def held_bytes(self, exclude_session: str | None = None) -> float:
        return sum(r.held_bytes for r in self.live.values() if r.session_id != exclude_session)

    def next_expiry_s(self) -> float | None:
        return min((r.expires_s for r in self.live.values()), default=None)
