"""``model_affinity``: whether the instance's live sessions are of the call's model."""

from __future__ import annotations

from talaria.core.routing.request import RouteRequest
from talaria.core.routing.scorers.base import Scorer, label, unit
from talaria.core.routing.settings import RoutingConfig
from talaria.core.status import InstanceStatus


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
    return unit((1 + max(0, mine.live_sessions)) / (1 + total))


SCORER = Scorer(model_affinity, label("model-affinity"))
