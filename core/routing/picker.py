"""The picker: weighted sum of scores, argmax, seeded tie-break, and a readable reason.

``total(i) = Σ_s weight_s × score_s(request, status_i)`` over the router's scorers. The winner
is the argmax; instances whose totals are exactly equal to the best are tied, and the winner
among them is ``rng.choice(sorted(tied names))`` — deterministic for a seeded ``rng``, and the
rng is only drawn from when there is a tie.

The reason names the scorer whose weighted contribution most separates the winner from the
runner-up (the best other total), ``argmax_s weight_s × (score_s(winner) − score_s(runner-up))``
(ties between scorers go to the first in registry order, core/routing/scorers/__init__.py),
labelled by that scorer's ``reason`` from the winner's state: ``model-active`` /
``model-staged`` / ``model-host`` (residency), ``kv-hbm`` / ``kv-host`` (KV locality),
``least-loaded`` (pressure), ``model-affinity`` (affinity); ``tie-break`` when the totals tie
or no scorer separates them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from talaria.core.routing.request import RouteRequest
from talaria.core.routing.scorers import SCORERS, get_scorer
from talaria.core.routing.settings import RoutingConfig
from talaria.core.status import InstanceStatus

TOTAL = "total"

Scores = dict[str, dict[str, float]]
"""instance → {scorer name: raw score in [0, 1], ..., "total": weighted sum}."""


@dataclass(frozen=True)
class RoutingDecision:
    """The chosen instance, the router that chose it, why (a reason label), and every
    candidate's scores."""

    instance: str
    router: str
    reason: str
    scores: Scores


def score_candidates(
    request: RouteRequest,
    candidates: Sequence[InstanceStatus],
    weights: Mapping[str, float],
    config: RoutingConfig,
) -> Scores:
    """Every candidate's raw score per scorer in ``weights`` and its weighted ``total``."""
    scorers = {name: get_scorer(name) for name in weights}
    scores: Scores = {}
    for status in candidates:
        row = {name: scorer(request, status, config) for name, scorer in scorers.items()}
        row[TOTAL] = sum(weights[name] * row[name] for name in weights)
        scores[status.instance] = row
    return scores


def tied_best(scores: Scores) -> list[str]:
    """The instances whose total equals the best total, sorted by name."""
    best = max(row[TOTAL] for row in scores.values())
    return sorted(name for name, row in scores.items() if row[TOTAL] == best)


def pick(scores: Scores, rng: random.Random) -> tuple[str, bool]:
    """(winner, whether it was a tie-break) over non-empty ``scores``."""
    tied = tied_best(scores)
    if len(tied) == 1:
        return tied[0], False
    return rng.choice(tied), True


def separating_scorer(winner: str, scores: Scores, weights: Mapping[str, float]) -> str | None:
    """The scorer with the largest ``weight × (score(winner) − score(runner-up))``, or None
    when there is no runner-up or no scorer separates them (ties: the first in registry
    order)."""
    others = sorted((n for n in scores if n != winner), key=lambda n: (-scores[n][TOTAL], n))
    if not others:
        return None
    runner_up = scores[others[0]]
    best: str | None = None
    best_gap = 0.0
    for name in SCORERS:
        if name not in weights:
            continue
        gap = weights[name] * (scores[winner][name] - runner_up[name])
        if gap > best_gap:
            best, best_gap = name, gap
    return best


def scorer_reason(scorer: str | None, request: RouteRequest, status: InstanceStatus) -> str:
    """The reason label of a win by ``scorer`` on ``status`` (its ``reason``; ``tie-break``
    when no scorer separated the winner)."""
    if scorer is None:
        return "tie-break"
    return get_scorer(scorer).reason(request, status)


def pick_by_score(
    router: str,
    request: RouteRequest,
    candidates: Sequence[InstanceStatus],
    scores: Scores,
    weights: Mapping[str, float],
    rng: random.Random,
) -> RoutingDecision:
    """The argmax decision with its reason (``tie-break`` when it was drawn among ties)."""
    winner, tie = pick(scores, rng)
    if tie:
        return RoutingDecision(winner, router, "tie-break", scores)
    status = next(s for s in candidates if s.instance == winner)
    scorer = separating_scorer(winner, scores, weights)
    return RoutingDecision(winner, router, scorer_reason(scorer, request, status), scores)
