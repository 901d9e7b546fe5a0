"""Routers: the named routing policies.

Every router runs the same code path (``route``): filter the instances that host the model,
score each with the scorers its weight table names (``RoutingConfig``; the scorers are
registered in core/routing/scorers/), then apply the router's rules before the argmax:

| router | scorers (default weights) | rule before scoring |
|---|---|---|
| ``talaria`` | residency, KV, parent KV 1; pressure, affinity 0.5 | reservation → its instance |
| ``load-only`` | pressure 1 (least outstanding work) | – |
| ``sticky`` | pressure 1 | the session's last instance, if a candidate |
| ``kv-aware`` | KV 1, pressure 0.5 (no model residency) | – |

Scores are reported for every candidate even when a rule decides. The live soft reservation
of the ``reserved`` rule (``RouteRequest.reserved_instance``) comes from the caller's
``core.preferences.SessionPreferences``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from talaria.core.routing.picker import RoutingDecision, pick_by_score, score_candidates
from talaria.core.routing.request import NoInstanceError, RouteRequest
from talaria.core.routing.scorers import SCORERS, get_scorer
from talaria.core.routing.settings import RoutingConfig
from talaria.core.status import InstanceStatus


@dataclass(frozen=True)
class Router:
    """A named routing policy: its rules before scoring (its weights are configuration)."""

    name: str
    reserved_rule: bool = False
    """A session with a live soft reservation goes to its instance (if it is a candidate)."""
    sticky_rule: bool = False
    """A session goes back to the instance of its previous call (if it is a candidate)."""


ROUTERS: dict[str, Router] = {
    "talaria": Router("talaria", reserved_rule=True),
    "load-only": Router("load-only"),
    "sticky": Router("sticky", sticky_rule=True),
    "kv-aware": Router("kv-aware"),
}
ROUTER_NAMES: tuple[str, ...] = tuple(ROUTERS)


def get_router(name: str) -> Router:
    """The router ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return ROUTERS[name]
    except KeyError:
        raise ValueError(
            f"unknown router {name!r}; choose from: {', '.join(ROUTER_NAMES)}"
        ) from None


def router_weights(config: RoutingConfig, router: str) -> dict[str, float]:
    """``router``'s weight table from ``config``, in registry order; ``ValueError`` for a
    scorer that is not registered."""
    table = config.weights(router)
    for name in table:
        get_scorer(name)
    return {name: table[name] for name in SCORERS if name in table}


def route(
    router_name: str,
    request: RouteRequest,
    statuses: Sequence[InstanceStatus],
    config: RoutingConfig,
    rng: random.Random,
) -> RoutingDecision:
    """Choose the instance for ``request`` among ``statuses`` (reasons: picker.py, plus
    ``only-candidate``, ``reserved`` and ``sticky``). Raises ``NoInstanceError`` when no
    instance hosts the model and ``ValueError`` for an unknown router."""
    router = get_router(router_name)
    candidates = sorted(
        (s for s in statuses if request.model in s.models), key=lambda s: s.instance
    )
    if not candidates:
        raise NoInstanceError(f"no instance hosts model {request.model!r}")
    weights = router_weights(config, router.name)
    scores = score_candidates(request, candidates, weights, config)
    names = {s.instance for s in candidates}
    if len(candidates) == 1:
        return RoutingDecision(candidates[0].instance, router.name, "only-candidate", scores)
    if router.reserved_rule and request.reserved_instance in names:
        assert request.reserved_instance is not None
        return RoutingDecision(request.reserved_instance, router.name, "reserved", scores)
    if router.sticky_rule and request.last_instance in names:
        assert request.last_instance is not None
        return RoutingDecision(request.last_instance, router.name, "sticky", scores)
    return pick_by_score(router.name, request, candidates, scores, weights, rng)
