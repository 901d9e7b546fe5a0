"""Adding a scorer is one definition plus one registry line, with its weight in the config.

The toy scorer below is written the way each file under core/routing/scorers/ is (a pure score,
a reason, ``SCORER = Scorer(...)``) and registered the way they are (one entry in ``SCORERS``),
by a fixture that takes the entry out again, so no other test sees it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from talaria.core.routing import (
    SCORERS,
    RouteRequest,
    RoutingConfig,
    Scorer,
    ScorerWeights,
    route,
)
from talaria.core.routing.scorers.base import label, unit
from talaria.core.status import InstanceStatus, ModelResidency, ModelState

REAL_SCORERS = (
    "model_residency",
    "kv_locality",
    "parent_kv",
    "instance_pressure",
    "model_affinity",
)


# -- the toy scorer, as a file under core/routing/scorers/ would define it -------------------
def free_kv(request: RouteRequest, status: InstanceStatus, config: RoutingConfig) -> float:
    """``1 − kv_utilization``: the share of the instance's KV memory still free."""
    return unit(1.0 - status.kv_utilization)


SCORER = Scorer(free_kv, label("free-kv"))


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The registry line, ``"free_kv": SCORER``, for one test only."""
    monkeypatch.setitem(SCORERS, "free_kv", SCORER)
    yield


REQ = RouteRequest(session_key="s", model="m", prompt_tokens=1000)
ACTIVE = {"m": ModelResidency("m", ModelState.ACTIVE, 0.0)}
ONE_TAU_AWAY = {"m": ModelResidency("m", ModelState.HOST, 10.0)}
# "a": the model active, its KV memory nearly full; "b": the model one τ away, its KV free
STATUSES = [
    InstanceStatus("a", 0.0, None, ACTIVE, {}, kv_utilization=0.9),
    InstanceStatus("b", 0.0, None, ONE_TAU_AWAY, {}),
]
DEFAULT = RoutingConfig()
WITH_FREE_KV = RoutingConfig(talaria=ScorerWeights(DEFAULT.talaria, free_kv=1.0))


def decide(config: RoutingConfig) -> tuple[str, str]:
    """(instance, reason) of the talaria router over ``STATUSES`` under ``config``."""
    decision = route("talaria", REQ, STATUSES, config, random.Random(0))
    return decision.instance, decision.reason


def test_the_default_choice() -> None:
    # a: 1 + 0.5/(1 + 0.9) + 0.5 ≈ 1.76 over b: 0.5 + 0.5 + 0.5 = 1.5
    assert decide(DEFAULT) == ("a", "model-active")


def test_routing_follows_a_registered_scorer_weighted_in_the_config(registered: None) -> None:
    # a: 1.76 + 0.1 over b: 1.5 + 1: the free KV decides, and names the reason
    assert decide(WITH_FREE_KV) == ("b", "free-kv")
    decision = route("talaria", REQ, STATUSES, WITH_FREE_KV, random.Random(0))
    assert decision.scores["b"]["free_kv"] == 1.0
    assert decision.scores["a"]["free_kv"] == pytest.approx(0.1)
    # registered but not in a router's weight table: not scored, the old choice
    assert decide(DEFAULT) == ("a", "model-active")
    assert "free_kv" not in route("talaria", REQ, STATUSES, DEFAULT, random.Random(0)).scores["a"]


def test_removing_it_restores_the_old_choice() -> None:
    with pytest.MonkeyPatch.context() as patch:  # what the fixture does, made visible
        patch.setitem(SCORERS, "free_kv", SCORER)
        assert decide(WITH_FREE_KV) == ("b", "free-kv")
    # the entry is gone: the registry holds the real scorers only, the old config gives the
    # old choice, and a weight for the removed scorer is an error
    assert tuple(SCORERS) == REAL_SCORERS
    assert decide(DEFAULT) == ("a", "model-active")
    with pytest.raises(ValueError, match="unknown scorer 'free_kv'"):
        decide(WITH_FREE_KV)
