"""Routing scorers: how good one instance is for one call, each a pure ``[0, 1]`` score.

A scorer is ``(request, status, config) -> float`` over an ``InstanceStatus`` snapshot
(core/status.py). It reads nothing else: no clock, no I/O, no randomness, so the same
snapshot always gives the same score (the picker adds the weights and the tie-break).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from talaria.core.status import InstanceStatus
from talaria.proxy.routing.settings import RoutingConfig


class NoInstanceError(LookupError):
    """No instance hosts the requested model."""


@dataclass(frozen=True)
class RouteRequest:
    """What routing knows about a call: its session and model, its prompt size, where the
    session's previous call ran (``last_instance``) and where its live proxy-level soft
    reservation is (``reserved_instance``, None when it has none or it expired)."""

    session_id: str
    model: str
    prompt_tokens: int
    last_instance: str | None = None
    reserved_instance: str | None = None


Scorer = Callable[[RouteRequest, InstanceStatus, RoutingConfig], float]


def _unit(value: float) -> float:
    """Clamp to [0, 1]; NaN counts as 0 (a broken snapshot never attracts calls)."""
    if math.isnan(value):
        return 0.0
    return min(1.0, max(0.0, value))


def model_residency(request: RouteRequest, status: InstanceStatus, config: RoutingConfig) -> float:
    """``1 / (1 + next_slot_in_s / τ)`` with τ = ``config.residency_tau_s``; 0 if the
    instance does not host the model.

    ``next_slot_in_s`` already includes the model's own switch (0 when active; the rest of
    staging + a device copy when staged; a full wake from host memory when asleep) and the
    slots ahead of it. At equal wait ahead, switch(active) = 0 < switch(staged) ≤
    switch(host), so the score orders active (1) > staged > host.
    """
    residency = status.models.get(request.model)
    if residency is None:
        return 0.0
    if math.isnan(residency.next_slot_in_s):
        return 0.0
    wait = max(0.0, residency.next_slot_in_s)
    return _unit(1.0 / (1.0 + wait / config.residency_tau_s))


def kv_locality(request: RouteRequest, status: InstanceStatus, config: RoutingConfig) -> float:
    """The session's KV for this model on the instance: in HBM → 1; in host memory →
    ``1 − restore_s / recompute_s`` clamped to [0, 1] (the fraction of the prefill a restore
    saves); absent, or held for another model → 0."""
    kv = status.sessions.get(request.session_id)
    if kv is None or kv.model != request.model or kv.tokens <= 0:
        return 0.0
    if kv.location == "hbm":
        return 1.0
    if kv.recompute_s <= 0.0:
        return 0.0
    return _unit(1.0 - kv.restore_s / kv.recompute_s)


def model_affinity(request: RouteRequest, status: InstanceStatus, config: RoutingConfig) -> float:
    """``(1 + live sessions of the model) / (1 + live sessions of every model)`` on the
    instance: 1 on an empty instance or one whose sessions are all of this model, → 0 where
    other models' sessions crowd it. Sessions of one model placed together keep that model
    resident there (demand-aware slots and co-residency follow the sessions), so a hot model
    ends up with nodes of its own instead of switching on every node."""
    mine = status.models.get(request.model)
    if mine is None:
        return 0.0
    total = sum(max(0, m.live_sessions) for m in status.models.values())
    return _unit((1 + max(0, mine.live_sessions)) / (1 + total))


def other_reserved_bytes(request: RouteRequest, status: InstanceStatus) -> float:
    """Bytes the instance's soft reservations hold for sessions other than this one."""
    return sum(b for sid, b in status.reserved.items() if sid != request.session_id)


def instance_load(request: RouteRequest, status: InstanceStatus, config: RoutingConfig) -> float:
    """``waiting_prompt_tokens / ref_tokens + running_calls / ref_calls + live sessions /
    ref_sessions + kv_utilization + reserved bytes of other sessions / ref_bytes`` (each term
    ≥ 0; references in ``RoutingConfig``). Live sessions count the work still to come from
    sessions placed there (in a tool gap now, back soon), not only the calls in flight."""
    live = sum(max(0, m.live_sessions) for m in status.models.values())
    return (
        max(0, status.waiting_prompt_tokens) / config.pressure_ref_tokens
        + live / config.pressure_ref_sessions
        + max(0, status.running_calls) / config.pressure_ref_calls
        + _unit(status.kv_utilization)
        + max(0.0, other_reserved_bytes(request, status)) / config.pressure_ref_bytes
    )


def instance_pressure(
    request: RouteRequest, status: InstanceStatus, config: RoutingConfig
) -> float:
    """``1 / (1 + load)``, load = ``instance_load`` (an idle instance scores 1)."""
    return _unit(1.0 / (1.0 + instance_load(request, status, config)))


SCORERS: dict[str, Scorer] = {
    "model_residency": model_residency,
    "kv_locality": kv_locality,
    "instance_pressure": instance_pressure,
    "model_affinity": model_affinity,
}
