"""Admission of a waiting call into the active slot. Pure: every input is an argument.

A call that was waiting when the slot opened belongs to the slot's batch and is admitted in every
policy (memory permitting). A call that arrives later is admitted at once when the slot is
uncontended (continuous batching). In a contended slot it waits for its model's next slot, unless
``sp_admission`` is on and it is a *continuation* (its session already ran on this node) whose
budget fits:

- time: estimated service time (prefill or KV restore of what is not cached, plus the expected
  output tokens at the current decode step time) ≤ time left before the slot's deadline;
- tokens: the HBM bytes it needs ≤ free HBM + staged weights + evictable idle KV − bytes held by
  other sessions' holds (checked by ``fits_memory``, for every admitted call).

A closing slot (quantum elapsed, draining) admits nothing. Under request-level instances
(``instances``: a serverless platform's model, flags.py ``serverless_instances``) every call of
a resident model is admitted while its slot is open, session or not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class AdmitReason(StrEnum):
    """Why a waiting call was admitted, or why it keeps waiting (rules in the module doc)."""

    SLOT_BATCH = "slot-batch"
    UNCONTENDED = "uncontended"
    SP_BUDGET = "sp-budget"
    INSTANCE = "instance"
    WAIT_CLOSING = "wait-closing"
    WAIT_NEXT_SLOT = "wait-next-slot"
    WAIT_NOT_CONTINUATION = "wait-not-continuation"
    WAIT_OVER_TIME_BUDGET = "wait-over-time-budget"


@dataclass(frozen=True)
class AdmissionDecision:
    """Admit or wait, and why."""

    admit: bool
    reason: AdmitReason

    @property
    def sp(self) -> bool:
        """Admitted mid-slot by the SP budget (the engine may give it SP priority)."""
        return self.reason is AdmitReason.SP_BUDGET


def decide_admission(
    *,
    sp_admission: bool,
    closing: bool,
    in_slot_batch: bool,
    contended: bool,
    is_continuation: bool,
    remaining_s: float,
    estimate_service_s: Callable[[], float],
    instances: bool = False,
) -> AdmissionDecision:
    """Admit or wait, in this order: closing → wait; in the slot's batch → admit; uncontended
    → admit; ``instances`` → admit; ``sp_admission`` off → wait for the next slot; not a
    continuation → wait; estimate_service_s() > remaining_s → wait; else admit by the SP
    budget.

    ``estimate_service_s`` is called only when the time budget decides (it costs a prefill and
    decode estimate; most calls are decided without it)."""
    if closing:
        return AdmissionDecision(False, AdmitReason.WAIT_CLOSING)
    if in_slot_batch:
        return AdmissionDecision(True, AdmitReason.SLOT_BATCH)
    if not contended:
        return AdmissionDecision(True, AdmitReason.UNCONTENDED)
    if instances:
        return AdmissionDecision(True, AdmitReason.INSTANCE)
    if not sp_admission:
        return AdmissionDecision(False, AdmitReason.WAIT_NEXT_SLOT)
    if not is_continuation:
        return AdmissionDecision(False, AdmitReason.WAIT_NOT_CONTINUATION)
    if estimate_service_s() > remaining_s:
        return AdmissionDecision(False, AdmitReason.WAIT_OVER_TIME_BUDGET)
    return AdmissionDecision(True, AdmitReason.SP_BUDGET)


def fits_memory(
    *, needed_bytes: float, free_bytes: float, evictable_bytes: float, held_bytes: float
) -> bool:
    """needed ≤ free + evictable − held (bytes held by other sessions' holds)."""
    return needed_bytes <= free_bytes + evictable_bytes - held_bytes
