"""The fair queue on the simulated node (runtime/scheduling/fairness.py through ``talaria
replay``'s experiment): a light interactive tenant beside a saturating bulk one is served
ahead of the backlog, a lone tenant's weight changes nothing, and each tenant's and class's
figures are reported."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from talaria.core.catalog import load_catalog
from talaria.core.trace import SessionTrace
from talaria.core.types import Priority
from talaria.sim.experiment import ExperimentSetup, run_experiment
from talaria.sim.presets import get_preset
from talaria.sim.tenants import TenantLoad
from talaria.sim.workload import PAPER_WORKLOAD

CATALOG = load_catalog()
PAPER = get_preset("paper")
MODELS = PAPER_WORKLOAD.models


def _loads() -> tuple[TenantLoad, TenantLoad]:
    """A bulk tenant over the node's capacity, and an interactive one arriving into its
    backlog (a smaller noisy-neighbour preset)."""
    bulk = TenantLoad(
        "bulk",
        replace(PAPER_WORKLOAD, sessions=60, total_calls=60 * 24, mean_interarrival_s=1.0),
    )
    ide = TenantLoad(
        "ide",
        replace(PAPER_WORKLOAD, sessions=4, total_calls=4 * 24, mean_interarrival_s=20.0),
        priority=Priority.INTERACTIVE,
        start_s=60.0,
    )
    return bulk, ide


def _replay(
    sessions: list[SessionTrace], policies: tuple[str, ...], weights: dict[str, float] | None = None
) -> dict[str, Any]:
    setup = ExperimentSetup(
        PAPER.server, PAPER.profile, MODELS, 1, PAPER.quantum_s, tenant_weights=weights or {}
    )
    return run_experiment(sessions, CATALOG, setup, policies, include_dedicated=False)["policies"]


@pytest.mark.parametrize("seed", [11, 14])
def test_an_interactive_tenant_is_served_ahead_of_a_bulk_backlog(seed: int) -> None:
    noisy = replace(get_preset("noisy"), tenants=_loads())
    sessions = noisy.sessions(CATALOG, seed)
    result = _replay(sessions, ("talaria", "-fair_queue"))
    fair, fifo = result["talaria"], result["-fair_queue"]
    calls = sum(s.num_calls for s in sessions)
    assert fair["calls_completed"] == fifo["calls_completed"] == calls  # none lost
    assert set(fair["tenants"]) == {"bulk", "ide"}
    assert set(fair["classes"]) == {"interactive", "standard"}
    assert fair["classes"]["interactive"]["sessions"] == 4
    ide_fair, ide_fifo = fair["tenants"]["ide"], fifo["tenants"]["ide"]
    assert ide_fair["mean_queue_s"] < ide_fifo["mean_queue_s"] / 2
    assert ide_fair["mean_sct_s"] < 0.8 * ide_fifo["mean_sct_s"]


def test_a_lone_tenants_weight_is_not_a_limit() -> None:
    sessions = replace(PAPER, workload=replace(PAPER_WORKLOAD, sessions=8, total_calls=96))
    drawn = sessions.sessions(CATALOG, 5)
    light = _replay(drawn, ("talaria",), {"default": 0.01})["talaria"]
    heavy = _replay(drawn, ("talaria",), {"default": 100.0})["talaria"]
    for figure in ("p50_sct_s", "p95_sct_s", "mean_sct_s", "calls_completed", "sct_s"):
        assert light[figure] == heavy[figure], figure
