"""What a plan's document reports of a layout besides its SCTs (sim/plan.py): its groups, its
weights' loads by the tier read from (core/weight_tiers.py) and each model's SLO
attainment."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from talaria.sim.placement import Layout


def loads_by_tier(weight_loads: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """The loads of every model's weights, by the tier read from."""
    total: dict[str, int] = {}
    for tiers in weight_loads.values():
        for tier, n in tiers.items():
            total[tier] = total.get(tier, 0) + n
    return dict(sorted(total.items()))


def attainment(
    p95_by_model: Mapping[str, float], bounds: Mapping[str, float]
) -> dict[str, dict[str, Any]]:
    """Each model's p95 SCT against its bound, and whether it meets it."""
    return {
        m: {
            "p95_sct_s": p95_by_model[m],
            "bound_s": bound,
            "met": p95_by_model[m] <= bound,
        }
        for m, bound in sorted(bounds.items())
    }


def groups_of(layout: Layout, gpus: Sequence[int]) -> list[dict[str, Any]]:
    """Each hosted set of models with its group size and how many groups host it."""
    counts: dict[tuple[tuple[str, ...], int], int] = {}
    for models, size in zip(layout, gpus, strict=True):
        counts[(models, size)] = counts.get((models, size), 0) + 1
    return [
        {"models": list(models), "group_gpus": size, "replicas": n}
        for (models, size), n in counts.items()
    ]
