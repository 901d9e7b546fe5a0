"""Slot policy: which model a node serves next, and when the active slot closes. Pure.

- Order: models take turns in their configured order, starting after the active one; a model
  with no waiting call is skipped; the active model comes last, so it keeps the node (a renewed
  slot, no switch) when only it has waiting calls.
- A slot has a deadline only while it is *contended*, i.e. another model has a waiting call.
  Uncontended, the active model runs as plain continuous batching, in every policy.
- A contended slot closes when its quantum has elapsed (``QUANTUM``), or earlier when it has
  nothing left to do (``IDLE``): no call running, no waiting call it may admit, and no live
  soft reservation expected back before the deadline.
- At the close no call is preempted: admission stops and the running calls drain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum


class CloseReason(StrEnum):
    QUANTUM = "quantum"
    IDLE = "idle"


def next_model(order: Sequence[str], active: str | None, waiting: Mapping[str, int]) -> str | None:
    """The first model after ``active`` in ``order`` (wrapping, ``active`` last) with waiting
    calls, or None when no model has any."""
    if not order:
        return None
    start = order.index(active) + 1 if active in order else 0
    for i in range(len(order)):
        model = order[(start + i) % len(order)]
        if waiting.get(model, 0) > 0:
            return model
    return None


def is_contended(active: str, waiting: Mapping[str, int]) -> bool:
    return any(n > 0 for model, n in waiting.items() if model != active)


def close_reason(
    *,
    now_s: float,
    deadline_s: float,
    contended: bool,
    running: int,
    admissible_waiting: bool,
    live_reservations: int,
) -> CloseReason | None:
    """Why the active slot closes now, or None to keep it open (rules in the module doc)."""
    if not contended:
        return None
    if now_s >= deadline_s:
        return CloseReason.QUANTUM
    if running == 0 and not admissible_waiting and live_reservations == 0:
        return CloseReason.IDLE
    return None
