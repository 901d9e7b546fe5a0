"""``kv_locality``: whether the session's KV is on the instance (HBM, or host memory)."""

from __future__ import annotations

from talaria.core.routing.request import RouteRequest
from talaria.core.routing.scorers.base import Scorer, unit
from talaria.core.routing.settings import RoutingConfig
from talaria.core.status import InstanceStatus


def kv_locality(request: RouteRequest, status: InstanceStatus, config: RoutingConfig) -> float:
    """The session's KV for this model on the instance: in HBM → 1; in host memory →
    ``1 − restore_s / recompute_s`` clamped to [0, 1] (the fraction of the prefill a restore
    saves); absent, or held for another model → 0."""
    kv = status.sessions.get(request.session_key)
    if kv is None or kv.model != request.model or kv.tokens <= 0:
        return 0.0
    if kv.location == "hbm":
        return 1.0
    if kv.recompute_s <= 0.0:
        return 0.0
    return unit(1.0 - kv.restore_s / kv.recompute_s)


def reason(request: RouteRequest, status: InstanceStatus) -> str:
    """``kv-hbm`` / ``kv-host``: where the session's KV is on the winner."""
    kv = status.sessions.get(request.session_key)
    return f"kv-{kv.location}" if kv is not None else "kv-hbm"


SCORER = Scorer(kv_locality, reason)
