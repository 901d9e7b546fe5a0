"""Routers: the named routing policies, and the proxy-level soft-reservation book.

Every router runs the same code path (``route``): filter the instances that host the model,
score each with the router's scorers and weights (``RoutingConfig``), then apply the router's
rules before the argmax:

| router | scorers (default weights) | rule before scoring |
|---|---|---|
| ``talaria`` | residency 1, KV locality 1, pressure 0.5 | live soft reservation → its instance |
| ``load-only`` | pressure 1 (least outstanding work) | – |
| ``sticky`` | pressure 1 | the session's last instance, if a candidate |
| ``kv-aware`` | KV locality 1, pressure 0.5 (no model residency) | – |

Scores are reported for every candidate even when a rule decides.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from talaria.core.reservations import GapEstimator, plan_reservation
from talaria.core.status import InstanceStatus
from talaria.proxy.routing.picker import RoutingDecision, pick_by_score, score_candidates
from talaria.proxy.routing.scorers import NoInstanceError, RouteRequest
from talaria.proxy.routing.settings import SCORER_NAMES, RoutingConfig


@dataclass(frozen=True)
class Router:
    name: str
    scorers: tuple[str, ...]
    reserved_rule: bool = False
    """A session with a live soft reservation goes to its instance (if it is a candidate)."""
    sticky_rule: bool = False
    """A session goes back to the instance of its previous call (if it is a candidate)."""


ROUTERS: dict[str, Router] = {
    "talaria": Router("talaria", SCORER_NAMES, reserved_rule=True),
    "load-only": Router("load-only", ("instance_pressure",)),
    "sticky": Router("sticky", ("instance_pressure",), sticky_rule=True),
    "kv-aware": Router("kv-aware", ("kv_locality", "instance_pressure")),
}
ROUTER_NAMES: tuple[str, ...] = tuple(ROUTERS)


def get_router(name: str) -> Router:
    try:
        return ROUTERS[name]
    except KeyError:
        raise ValueError(
            f"unknown router {name!r}; choose from: {', '.join(ROUTER_NAMES)}"
        ) from None


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
    weights = config.weights(router.name).as_dict()
    weights = {name: weights[name] for name in router.scorers}
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


@dataclass
class _Held:
    instance: str
    expires_s: float


@dataclass
class ReservationBook:
    """Proxy-level soft reservations: session → (instance, expiry), for the ``reserved`` rule.

    When a call ends and the session continues, ``finished`` records the instance until
    ``now + max(2 × gap, gap + 1 s)`` (``core.reservations.plan_reservation`` with no slot
    deadline: the proxy does not see slots). The gap is learned per session, hint-free
    (``GapEstimator``: prior 3.2 s, then the mean observed gap between a call's end and the
    session's next call). ``reserved`` reads a live one; ``started`` releases it (the session
    is back); a final call forgets the session. Time is always an argument.
    """

    live: dict[str, _Held] = field(default_factory=dict)
    gaps: dict[str, GapEstimator] = field(default_factory=dict)
    last_finish_s: dict[str, float] = field(default_factory=dict)

    def reserved(self, session_id: str, now_s: float) -> str | None:
        """The instance of the session's live reservation (None if none or expired)."""
        held = self.live.get(session_id)
        if held is None:
            return None
        if held.expires_s <= now_s:
            del self.live[session_id]
            return None
        return held.instance

    def started(self, session_id: str, now_s: float) -> None:
        """A call of the session arrives: observe its gap and release its reservation."""
        last = self.last_finish_s.get(session_id)
        if last is not None:
            self.gaps.setdefault(session_id, GapEstimator()).observe(now_s - last)
        self.live.pop(session_id, None)

    def finished(
        self, session_id: str, model: str, instance: str, now_s: float, final: bool
    ) -> None:
        """A call ended on ``instance``: hold it for the session's next call, or forget it."""
        if final:
            self.live.pop(session_id, None)
            self.gaps.pop(session_id, None)
            self.last_finish_s.pop(session_id, None)
            return
        self.last_finish_s[session_id] = now_s
        gap = self.gaps.setdefault(session_id, GapEstimator()).expected_s()
        plan = plan_reservation(
            session_id=session_id,
            model=model,
            now_s=now_s,
            expected_gap_s=gap,
            held_bytes=0.0,
            deadline_s=None,
        )
        if plan is not None:
            self.live[session_id] = _Held(instance, plan.expires_s)
