"""The node scheduler's settings other than its feature flags (those are in flags.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    """One node scheduler's constants."""

    quantum_s: float = 60.0
    """The base slot length Q: a contended slot's deadline is its start + Q (with
    ``demand_slots``, start + Q × clamp(n × share, ½, 2): ``slots.slot_length_s``)."""
    default_output_tokens: int = 256
    """Output estimate for a session's first call (vLLM-style clients rarely cap it lower)."""
    stale_after_quanta: float = 10.0
    """A session idle for this many quanta no longer counts as expected back (demand)."""
