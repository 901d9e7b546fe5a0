"""What a runtime instance reports about itself: the snapshot the proxy's routing scorers read.

It is plain data (no methods that do I/O), the same whether it comes from an in-process node or,
later, over HTTP as JSON (``to_dict`` / ``from_dict``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class ModelState(StrEnum):
    """Where a model's weights are on an instance."""

    ACTIVE = "active"  # weights in HBM, serving now
    STAGED = "staged"  # weights (partly) staged in free HBM for the next switch
    HOST = "host"  # asleep: weights in host memory, a wake-up away


@dataclass(frozen=True)
class ModelResidency:
    """One model on an instance: where its weights are and how soon it would serve."""

    model: str
    state: ModelState
    next_slot_in_s: float
    """Estimated seconds until this model serves on the instance (0 when active): the rest of the
    current slot if it is contended, plus a quantum and a switch for each model ahead of it in the
    round-robin order that has waiting calls, plus its own switch."""
    staged_fraction: float = 0.0
    """Fraction of its weights already staged in HBM (0–1)."""
    switch_s: float = 0.0
    """Seconds a switch to this model would take now (wake, or the rest of staging + D2D)."""
    waiting_calls: int = 0
    """Calls queued on the instance for this model."""
    live_sessions: int = 0
    """Sessions of this model living on the instance: a call queued or running, or back from
    one within the scheduler's stale window (a tool gap)."""


@dataclass(frozen=True)
class SlotView:
    """One time slot of the instance, in clock seconds: the switch into it began at
    ``start_s`` and its model began serving at ``start_s + switch_s``; ``end_s`` is None while
    the slot is open, then the time it closed, for ``close`` (a ``CloseReason`` value).
    ``admitted``: calls admitted in it."""

    model: str
    start_s: float
    switch_s: float
    end_s: float | None = None
    close: str | None = None
    admitted: int = 0


RECENT_SLOTS = 24
"""How many of the latest slots ``InstanceStatus.recent_slots`` holds."""


@dataclass(frozen=True)
class SessionKvStatus:
    """Where one session's KV cache is on the instance, and what reusing it would cost
    (seconds)."""

    location: str  # "hbm" or "host"
    tokens: int
    model: str
    restore_s: float  # host → HBM transfer time (0 in HBM)
    recompute_s: float  # prefill time if the KV were gone


@dataclass(frozen=True)
class TenantShare:
    """One tenant's part of an instance now (``tenants`` of ``InstanceStatus``, keyed by the
    tenant's digest, ``CallRequest.tenant``): the service seconds its calls have had here
    (admission to finish, measured), its calls waiting and running, and how long its oldest
    waiting call has waited (seconds; 0 with none waiting)."""

    served_s: float = 0.0
    waiting_calls: int = 0
    running_calls: int = 0
    oldest_wait_s: float = 0.0


@dataclass(frozen=True)
class InstanceStatus:
    """One instance's snapshot at ``at_s`` (seconds of its clock): its models, the KV of its
    sessions (keyed by ``session_key``: the proxy's key of the session), its reservations,
    queues and recent slots."""

    instance: str
    at_s: float
    active_model: str | None
    models: dict[str, ModelResidency]
    sessions: dict[str, SessionKvStatus] = field(default_factory=dict)
    reserved: dict[str, float] = field(default_factory=dict)
    """session → bytes its soft reservation holds on this instance."""
    waiting_calls: int = 0
    waiting_prompt_tokens: int = 0
    running_calls: int = 0
    kv_utilization: float = 0.0
    """KV bytes in HBM ÷ HBM left for KV after weights (0–1)."""
    recent_slots: list[SlotView] = field(default_factory=list)
    """The last ``RECENT_SLOTS`` slots, oldest first (the open one last)."""
    tenants: dict[str, TenantShare] = field(default_factory=dict)
    """Per tenant digest with calls here so far: its share of the service and its queue."""

    @property
    def reserved_bytes(self) -> float:
        """Bytes held by all soft reservations on the instance."""
        return sum(self.reserved.values())

    def to_dict(self) -> dict[str, Any]:
        """The snapshot as plain JSON-ready data (``from_dict`` reads it back)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InstanceStatus:
        """The snapshot ``to_dict`` wrote (nested dataclasses and enums rebuilt)."""
        models = {
            name: ModelResidency(**{**m, "state": ModelState(m["state"])})
            for name, m in data["models"].items()
        }
        sessions = {sid: SessionKvStatus(**s) for sid, s in data.get("sessions", {}).items()}
        slots = [SlotView(**s) for s in data.get("recent_slots", ())]
        tenants = {t: TenantShare(**v) for t, v in data.get("tenants", {}).items()}
        nested = ("models", "sessions", "recent_slots", "tenants")
        rest = {k: v for k, v in data.items() if k not in nested}
        return cls(models=models, sessions=sessions, recent_slots=slots, tenants=tenants, **rest)
