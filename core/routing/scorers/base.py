"""What a routing scorer is: a pure ``[0, 1]`` score of one instance for one call, and the
reason label of a decision it wins.

A score reads the ``RouteRequest``, the instance's ``InstanceStatus`` snapshot
(core/status.py) and the ``RoutingConfig`` (its reference scales) and nothing else: no clock,
no I/O, no randomness, so the same snapshot always gives the same score (the picker adds the
weights, which come from the config, and the tie-break).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from talaria.core.routing.request import RouteRequest
from talaria.core.routing.settings import RoutingConfig
from talaria.core.status import InstanceStatus

ScoreFn = Callable[[RouteRequest, InstanceStatus, RoutingConfig], float]
"""``(request, status, config) -> score in [0, 1]``."""

ReasonFn = Callable[[RouteRequest, InstanceStatus], str]
"""``(request, winner's status) -> reason label`` of a decision this scorer separated."""


@dataclass(frozen=True)
class Scorer:
    """One registered scorer (core/routing/scorers/__init__.py): its score and its reason."""

    score: ScoreFn
    reason: ReasonFn

    def __call__(
        self, request: RouteRequest, status: InstanceStatus, config: RoutingConfig
    ) -> float:
        """The score of ``status`` for ``request`` (``self.score``)."""
        return self.score(request, status, config)


def unit(value: float) -> float:
    """Clamp to [0, 1]; NaN counts as 0 (a broken snapshot never attracts calls)."""
    if math.isnan(value):
        return 0.0
    return min(1.0, max(0.0, value))


def label(text: str) -> ReasonFn:
    """A reason that is always ``text``, whatever the winner's state."""

    def reason(request: RouteRequest, status: InstanceStatus) -> str:
        return text

    return reason
