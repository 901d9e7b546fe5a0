"""Session-aware routing: which runtime instance serves a call.

Pure functions over ``InstanceStatus`` snapshots: no I/O, no clock reads (``now_s`` is an
argument where time matters), no global RNG (a seeded ``random.Random`` is an argument).
The simulator's cluster replay (sim/cluster.py) calls the same ``route`` the proxy will.

Dependency rule: proxy code imports only ``talaria.core`` and itself, with one exception here:
``talaria.core.status``, the plain-data snapshot that is the wire format of the runtime seam
(``InstanceStatus.to_dict`` / ``from_dict``). Nothing else of ``talaria.runtime`` or any of
``talaria.sim`` is imported.

- ``scorers``: ``model_residency``, ``kv_locality``, ``instance_pressure`` (formulas there);
- ``picker``: weighted sum, argmax, seeded tie-break, the reason label;
- ``routers``: ``talaria``, ``load-only``, ``sticky``, ``kv-aware``; ``route`` (the proxy-level
  soft reservations its ``reserved`` rule reads are ``core.reservations.SessionReservations``);
- ``settings``: ``RoutingConfig`` (weights per router, reference scales).
"""

from talaria.proxy.routing.picker import RoutingDecision
from talaria.proxy.routing.routers import (
    ROUTER_NAMES,
    ROUTERS,
    Router,
    get_router,
    route,
)
from talaria.proxy.routing.scorers import (
    SCORERS,
    NoInstanceError,
    RouteRequest,
    instance_pressure,
    kv_locality,
    model_residency,
)
from talaria.proxy.routing.settings import SCORER_NAMES, RoutingConfig, ScorerWeights

__all__ = [
    "ROUTERS",
    "ROUTER_NAMES",
    "SCORERS",
    "SCORER_NAMES",
    "NoInstanceError",
    "RouteRequest",
    "Router",
    "RoutingConfig",
    "RoutingDecision",
    "ScorerWeights",
    "get_router",
    "instance_pressure",
    "kv_locality",
    "model_residency",
    "route",
]
