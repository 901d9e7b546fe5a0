"""The fleet preset (sim/presets.py): fifteen catalog models packed onto nodes by the replayed
sessions' demand (sim/placement.py), and a short replay of it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from talaria.cli.common import generate
from talaria.core.catalog import load_catalog
from talaria.sim.experiment import run_experiment
from talaria.sim.placement import NoPlacement, model_demand, weight_budget_bytes
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
