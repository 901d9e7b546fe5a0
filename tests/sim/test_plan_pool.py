"""sim/plan_pool.py: the coldest models pooled on one or two whole nodes, the most that meet."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from talaria.sim.placement import Layout
from talaria.sim.plan_pool import pooled, search_pools

# six models alone on their groups (4 GPUs each), by demand: a coldest … f busiest
LAYOUT: Layout = (("a",), ("b",), ("c",), ("d",), ("e",), ("f",))
GPUS = (4, 4, 4, 4, 4, 4)
DEMAND = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0, "e": 5.0, "f": 6.0}
WEIGHTS = dict.fromkeys(DEMAND, 100.0)


def test_pooled_moves_the_cold_models_onto_whole_nodes_and_keeps_the_rest() -> None:
    moved = pooled(LAYOUT, GPUS, ["a", "b", "c"], 1, DEMAND, WEIGHTS, 1_000.0, 8)
    assert moved is not None
    layout, gpus = moved
    assert layout[:3] == (("d",), ("e",), ("f",)) and gpus == (4, 4, 4, 8)
    assert sorted(layout[3]) == ["a", "b", "c"]
    assert pooled(LAYOUT, GPUS, ["a", "b", "c"], 1, DEMAND, WEIGHTS, 250.0, 8) is None  # room


@pytest.mark.parametrize(
    ("capacity", "best"), [({1: 3, 2: 5}, {1: 3, 2: 5}), ({1: 0, 2: 2}, {2: 2})]
)
def test_the_largest_pool_that_meets_is_found_for_each_size(
    capacity: dict[int, int], best: dict[int, int]
) -> None:
    """A pool of k nodes meets the SLO with at most ``capacity[k]`` models (monotone in j)."""
    replayed: list[tuple[Layout, tuple[int, ...]]] = []

    def meets(candidates: Sequence[tuple[Layout, tuple[int, ...]]]) -> list[bool]:
        replayed.extend(candidates)
        answers = []
        for layout, gpus in candidates:
            nodes = sum(1 for g in gpus if g == 8)
            pooled_models = sum(len(m) for m, g in zip(layout, gpus, strict=True) if g == 8)
            answers.append(pooled_models <= capacity[nodes])
        return answers

    search_pools(LAYOUT, GPUS, DEMAND, WEIGHTS, 1_000.0, 8, meets)
    assert len(set(replayed)) == len(replayed)  # each layout replayed once
    found: dict[int, int] = {}
    for layout, gpus in replayed:
        nodes = sum(1 for g in gpus if g == 8)
        count = sum(len(m) for m, g in zip(layout, gpus, strict=True) if g == 8)
        if count <= capacity[nodes]:
            found[nodes] = max(found.get(nodes, 0), count)
    assert found == best
    # 3 nodes would need 24 GPUs of the 24 the six groups free: never tried
    assert all(sum(1 for g in gpus if g == 8) <= 2 for _, gpus in replayed)
