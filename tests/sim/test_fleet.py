"""The fleet preset (sim/presets.py): fifteen catalog models packed onto nodes by the replayed
sessions' demand (sim/placement.py), and a short replay of it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from talaria.cli.common import generate
from talaria.core.catalog import load_catalog
from talaria.core.groups import fit_together
from talaria.sim.experiment import run_experiment
from talaria.sim.placement import (
    NoPlacement,
    model_demand,
    movers,
    share_group,
    weight_budget_bytes,
)
from talaria.sim.presets import get_preset

CATALOG = load_catalog()
FLEET = get_preset("fleet")
SHORT = replace(FLEET, workload=replace(FLEET.workload, sessions=40, total_calls=40 * 8))


def test_every_fleet_model_fits_a_node_and_is_over_100b() -> None:
    server = CATALOG.server(FLEET.server)
    assert 12 <= len(FLEET.workload.models) <= 20
    for name in FLEET.workload.models:
        model = CATALOG.model(name)
        assert model.total_params >= 100e9, name
        assert model.weight_bytes < server.usable_hbm_bytes, name


def test_the_layout_is_packed_by_demand_within_each_nodes_weight_budget() -> None:
    sessions = generate(SHORT.workload, CATALOG, 3)
    setup = SHORT.experiment_setup(None, sessions, CATALOG)
    assert setup.nodes == FLEET.packed_nodes == len(setup.layout())
    budget = weight_budget_bytes(CATALOG, FLEET.server)
    placed = [m for _, node in setup.layout() for m in node.models]
    assert set(placed) == set(FLEET.workload.models)  # every model, even one with no session
    for _, node in setup.layout():
        assert sum(CATALOG.model(m).weight_bytes for m in node.models) <= budget
    demand = model_demand(sessions, CATALOG, FLEET.server, FLEET.profile)
    hottest = max(demand, key=demand.__getitem__)
    alone = [node.models for _, node in setup.layout() if hottest in node.models]
    assert min(len(models) for models in alone) == 1  # the hottest has a node to itself
    assert SHORT.experiment_setup(12, sessions, CATALOG).nodes == 12  # --nodes applies
    with pytest.raises(NoPlacement):
        SHORT.experiment_setup(3, sessions, CATALOG)  # 6 TB of weights on 3 nodes
    with pytest.raises(ValueError, match="demand"):
        SHORT.experiment_setup(8)


def test_a_short_fleet_replay_completes_every_call() -> None:
    sessions = generate(SHORT.workload, CATALOG, 0)
    setup = SHORT.experiment_setup(6, sessions, CATALOG)
    doc = run_experiment(sessions, CATALOG, setup, ["talaria"])
    calls = sum(s.num_calls for s in sessions)
    assert doc["policies"]["talaria"]["calls_completed"] == calls
    assert doc["dedicated"]["calls_completed"] == calls


GB = 1e9


def _share(
    layout: tuple[tuple[str, ...], ...],
    gpus: tuple[int, ...],
    demand: dict[str, float],
    weights: dict[str, float],
    minimum: dict[str, int],
    together: frozenset[frozenset[str]] = frozenset(),
) -> list[tuple[tuple[tuple[str, ...], ...], tuple[int, ...]]]:
    """Every mover in turn moved and kept (what the plan does while every replay meets the
    SLO), with a node budget of 1,000 GB over 8 GPUs; ``together``: the sets that may be
    resident together. The layouts after each kept move."""
    steps = []
    for model in movers(layout, demand):
        if model not in movers(layout, demand):
            continue  # it hosts another now
        moved = share_group(
            layout, gpus, model, demand, weights, minimum, 1000 * GB, 8,
            lambda names, size: frozenset(names) in together,
        )  # fmt: skip
        if moved is not None:
            layout, gpus = moved
            steps.append(moved)
    return steps


def test_movers_are_the_models_alone_on_one_group_coldest_first() -> None:
    demand = {"a": 5.0, "b": 1.0, "c": 3.0, "d": 0.0}
    layout = (("a",), ("b",), ("c", "d"), ("e",), ("e",))
    assert movers(layout, demand) == ["b", "a"]  # c and d share, e is replicated
    assert movers((("x",), ("y",)), {}) == ["x", "y"]  # no demand: by name


def test_a_mover_goes_to_the_least_loaded_group_that_holds_it() -> None:
    layout, gpus = (("hot",), ("warm",), ("cold",), ("colder",)), (4, 4, 2, 1)
    demand = {"hot": 900.0, "warm": 300.0, "cold": 20.0, "colder": 10.0}
    weights = {"hot": 200 * GB, "warm": 150 * GB, "cold": 60 * GB, "colder": 30 * GB}
    minimum = {"hot": 4, "warm": 4, "cold": 2, "colder": 1}
    steps = _share(layout, gpus, demand, weights, minimum)
    assert steps == [
        # colder (1 GPU) first, into the least loaded group that holds it: cold's 2 GPUs
        ((("hot",), ("warm",), ("cold", "colder")), (4, 4, 2)),
        # cold hosts colder now, so it stays; warm goes into hot's 4 GPUs (350 of 500 GB)
        ((("hot", "warm"), ("cold", "colder")), (4, 2)),
    ]


def test_a_move_respects_the_smallest_group_the_budget_and_prefers_residence() -> None:
    layout, gpus = (("a",), ("b",), ("c",)), (4, 2, 1)
    demand = {"a": 500.0, "b": 100.0, "c": 1.0}
    weights = {"a": 300 * GB, "b": 100 * GB, "c": 50 * GB}
    # c needs 2 GPUs at least: of a (4) and b (2), b is less loaded; with no residence
    # preference it goes to b
    minimum = {"a": 4, "b": 2, "c": 1}
    assert _share(layout, gpus, demand, weights, minimum)[0][0] == (("a",), ("b", "c"))
    # a with c stays resident together, b with c would switch: a is preferred
    pair = frozenset({frozenset({"a", "c"})})
    assert _share(layout, gpus, demand, weights, minimum, pair)[0][0] == (("a", "c"), ("b",))
    # a group's share of the pinned budget: 2 GPUs hold 250 GB, b + c = 150 GB fit; with c at
    # 200 GB they do not, and a's 500 GB share holds 300 + 200
    heavy = {**weights, "c": 200 * GB}
    assert _share(layout, gpus, demand, heavy, minimum)[0][0] == (("a", "c"), ("b",))
    # a, the colder, needs 4 GPUs: it stays out of b's 2; then b moves into a's 4
    light = {"a": 10 * GB, "b": 10 * GB}
    steps = _share((("a",), ("b",)), (4, 2), {"a": 1.0, "b": 2.0}, light, {"a": 4, "b": 2})
    assert steps == [((("a", "b"),), (4,))]
    # a replicated model never moves: the single one joins it
    assert _share((("a",), ("a",), ("b",)), (4, 4, 4), demand, weights, minimum) == [
        ((("a", "b"), ("a",)), (4, 4))
    ]


def test_fit_together_is_the_resident_set_rule() -> None:
    server = CATALOG.server("h200x8")
    oss, air = CATALOG.model("gpt-oss-120b"), CATALOG.model("glm-4.5-air-fp8")
    glm, minimax = CATALOG.model("glm-4.5-fp8"), CATALOG.model("minimax-m2")
    assert fit_together([oss, air], server, 2)  # 171 GB + one 131k-token sequence of Air
    assert not fit_together([glm, minimax], server, 4)  # 585 GB > 4 × 126.9 GB
    assert fit_together([glm, minimax], server, 8)
