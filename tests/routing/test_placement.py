"""Placement terms of routing: ``model_affinity`` and the live sessions counted as load, and
what the talaria router does with them for a new session."""

from __future__ import annotations

import random

import pytest

from talaria.core.routing import RouteRequest, RoutingConfig, instance_pressure, route
from talaria.core.routing.scorers.instance_pressure import instance_load
from talaria.core.routing.scorers.model_affinity import model_affinity
from talaria.core.status import InstanceStatus, ModelResidency, ModelState

CONFIG = RoutingConfig()
NEW = RouteRequest(session_key="new", model="m", prompt_tokens=1000)


def node(name: str, live: dict[str, int], active: str = "m") -> InstanceStatus:
    models = {
        model: ModelResidency(
            model,
            ModelState.ACTIVE if model == active else ModelState.HOST,
            0.0 if model == active else 10.0,
            live_sessions=count,
        )
        for model, count in live.items()
    }
    return InstanceStatus(name, 0.0, active, models)


@pytest.mark.parametrize(
    ("live", "expected"),
    [
        ({"m": 0, "o": 0}, 1.0),  # empty: any model may have it to itself
        ({"m": 4, "o": 0}, 1.0),  # all of its sessions are this model's
        ({"m": 0, "o": 4}, 1 / 5),  # crowded by another model's sessions
        ({"m": 2, "o": 2}, 3 / 5),
    ],
)
def test_model_affinity(live: dict[str, int], expected: float) -> None:
    assert model_affinity(NEW, node("i", live), CONFIG) == pytest.approx(expected)


def test_affinity_is_zero_where_the_model_is_not_hosted() -> None:
    assert model_affinity(NEW, node("i", {"o": 1}, active="o"), CONFIG) == 0.0


def test_live_sessions_count_as_load() -> None:
    """16 sessions in tool gaps (nothing running) are half a unit of load (ref 32)."""
    idle = node("i", {"m": 0})
    gaps = node("i", {"m": 16})
    assert instance_load(NEW, idle, CONFIG) == 0.0
    assert instance_load(NEW, gaps, CONFIG) == pytest.approx(16 / CONFIG.pressure_ref_sessions)
    assert instance_pressure(NEW, gaps, CONFIG) < instance_pressure(NEW, idle, CONFIG)


def test_a_new_session_goes_where_its_model_lives_not_where_another_crowds() -> None:
    """Both nodes have "m" active and equal live load; on i1 the sessions are another
    model's, which will claim slots there: the new session goes to i0."""
    i0 = node("i0", {"m": 6, "o": 0})
    i1 = node("i1", {"m": 0, "o": 6})
    decision = route("talaria", NEW, [i0, i1], CONFIG, random.Random(0))
    assert (decision.instance, decision.reason) == ("i0", "model-affinity")
    assert decision.scores["i0"]["model_affinity"] > decision.scores["i1"]["model_affinity"]


def test_a_new_session_avoids_a_node_full_of_sessions() -> None:
    """Same model mix, but i0 holds 64 more live sessions (2 units of load): the new session
    goes to the emptier i1."""
    i0 = node("i0", {"m": 64})
    i1 = node("i1", {"m": 0})
    assert route("talaria", NEW, [i0, i1], CONFIG, random.Random(0)).instance == "i1"
