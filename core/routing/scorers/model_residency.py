"""``model_residency``: how soon the instance serves the call's model (active > staged > host)."""

from __future__ import annotations

import math

from talaria.core.routing.request import RouteRequest
from talaria.core.routing.scorers.base import Scorer, unit
from talaria.core.routing.settings import RoutingConfig
from talaria.core.status import InstanceStatus


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
    return unit(1.0 / (1.0 + wait / config.residency_tau_s))


def reason(request: RouteRequest, status: InstanceStatus) -> str:
    """``model-active`` / ``model-staged`` / ``model-host``: the model's state on the winner."""
    residency = status.models.get(request.model)
    return f"model-{residency.state.value}" if residency is not None else "model-host"


SCORER = Scorer(model_residency, reason)
