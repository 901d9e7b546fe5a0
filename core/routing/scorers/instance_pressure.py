"""``instance_pressure``: how little work the instance has queued, running and still to come."""

from __future__ import annotations

from talaria.core.routing.request import RouteRequest
from talaria.core.routing.scorers.base import Scorer, label, unit
from talaria.core.routing.settings import RoutingConfig
from talaria.core.status import InstanceStatus


def other_reserved_bytes(request: RouteRequest, status: InstanceStatus) -> float:
    """Bytes the instance's soft reservations hold for sessions other than this one."""
    return sum(b for sid, b in status.reserved.items() if sid != request.session_key)


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
        + unit(status.kv_utilization)
        + max(0.0, other_reserved_bytes(request, status)) / config.pressure_ref_bytes
    )


def instance_pressure(
    request: RouteRequest, status: InstanceStatus, config: RoutingConfig
) -> float:
    """``1 / (1 + load)``, load = ``instance_load`` (an idle instance scores 1)."""
    return unit(1.0 / (1.0 + instance_load(request, status, config)))


SCORER = Scorer(instance_pressure, label("least-loaded"))
