"""Session-aware routing: which runtime instance serves a call.

Pure functions over ``InstanceStatus`` snapshots (core/status.py, the plain-data wire format
of the runtime seam): no I/O, no clock reads (``now_s`` is an argument where time matters), no
global RNG (a seeded ``random.Random`` is an argument). It lives in core so that the proxy's
gateway and the simulator's cluster replay (sim/cluster.py) call the same ``route``; it imports
only ``talaria.core``, never ``proxy``, ``runtime`` or ``sim``.

- ``request``: ``RouteRequest`` (what routing knows about a call), ``NoInstanceError``;
- ``scorers/``: one file per scorer, ``model_residency``, ``kv_locality``,
  ``instance_pressure``, ``model_affinity``, ``parent_kv`` (formulas there), and the registry
  ``SCORERS`` (name → ``Scorer``, one line each);
- ``picker``: weighted sum, argmax, seeded tie-break, the reason label;
- ``routers``: ``talaria``, ``load-only``, ``sticky``, ``kv-aware``; ``route`` (the proxy-level
  soft reservations its ``reserved`` rule reads are ``core.preferences.SessionPreferences``);
- ``settings``: ``RoutingConfig`` (each router's weight table, the scorers' reference scales).
"""

from talaria.core.routing.picker import RoutingDecision
from talaria.core.routing.request import NoInstanceError, RouteRequest
from talaria.core.routing.routers import ROUTER_NAMES, ROUTERS, Router, get_router, route
from talaria.core.routing.scorers import SCORERS, get_scorer
from talaria.core.routing.scorers.base import Scorer
from talaria.core.routing.scorers.instance_pressure import instance_pressure
from talaria.core.routing.scorers.kv_locality import kv_locality
from talaria.core.routing.scorers.model_affinity import model_affinity
from talaria.core.routing.scorers.model_residency import model_residency
from talaria.core.routing.scorers.parent_kv import parent_kv
from talaria.core.routing.settings import RoutingConfig, ScorerWeights

__all__ = [
    "ROUTERS",
    "ROUTER_NAMES",
    "SCORERS",
    "NoInstanceError",
    "RouteRequest",
    "Router",
    "RoutingConfig",
    "RoutingDecision",
    "Scorer",
    "ScorerWeights",
    "get_router",
    "get_scorer",
    "instance_pressure",
    "kv_locality",
    "model_affinity",
    "model_residency",
    "parent_kv",
    "route",
]
