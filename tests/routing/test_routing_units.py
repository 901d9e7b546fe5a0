"""Routing on hand-built snapshots: each scorer's formula, the picker's ties and reasons, each
router's rules. (The proxy-level reservation book:
tests/unit/proxy/sessions/test_session_reservations.py.)

Default ``RoutingConfig``: τ = 10 s, references 8,192 waiting tokens / 32 running calls /
100 GB of others' reservations; talaria weights residency 1, KV 1, pressure 0.5, affinity 0.5
(tests/routing/test_placement.py covers affinity and live sessions as load).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from talaria.core.routing import (
    ROUTER_NAMES,
    NoInstanceError,
    RouteRequest,
    RoutingConfig,
    ScorerWeights,
    instance_pressure,
    kv_locality,
    model_residency,
    route,
)
from talaria.core.status import InstanceStatus, ModelResidency, ModelState, SessionKvStatus

CONFIG = RoutingConfig()
REQ = RouteRequest(session_key="s", model="m", prompt_tokens=1000)


def status(
    name: str = "i0",
    state: ModelState = ModelState.ACTIVE,
    next_slot_in_s: float = 0.0,
    models: dict[str, ModelResidency] | None = None,
    kv: SessionKvStatus | None = None,
    **load: Any,
) -> InstanceStatus:
    """An instance hosting model "m" (unless ``models`` says otherwise), with session "s"'s
    KV if ``kv`` is given."""
    if models is None:
        models = {"m": ModelResidency("m", state, next_slot_in_s)}
    sessions = {"s": kv} if kv is not None else {}
    return InstanceStatus(name, 0.0, None, models, sessions, **load)


def hbm(model: str = "m") -> SessionKvStatus:
    return SessionKvStatus("hbm", 4000, model, 0.0, 1.0)


def host(restore_s: float, recompute_s: float, model: str = "m") -> SessionKvStatus:
    return SessionKvStatus("host", 4000, model, restore_s, recompute_s)


# -- scorers ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("state", "next_slot_in_s", "expected"),
    [
        (ModelState.ACTIVE, 0.0, 1.0),
        (ModelState.STAGED, 0.5, 1 / 1.05),  # 1 / (1 + 0.5/10)
        (ModelState.HOST, 10.0, 0.5),  # one τ away
        (ModelState.HOST, 30.0, 0.25),
        (ModelState.HOST, 90.0, 0.1),
    ],
)
def test_model_residency(state: ModelState, next_slot_in_s: float, expected: float) -> None:
    assert model_residency(REQ, status(state=state, next_slot_in_s=next_slot_in_s), CONFIG) == (
        pytest.approx(expected)
    )


def test_model_residency_of_an_unhosted_model_is_zero_and_tau_scales() -> None:
    assert model_residency(REQ, status(models={}), CONFIG) == 0.0
    slow = RoutingConfig(residency_tau_s=30.0)
    assert model_residency(REQ, status(state=ModelState.HOST, next_slot_in_s=30.0), slow) == 0.5


@pytest.mark.parametrize(
    ("kv", "expected"),
    [
        (None, 0.0),  # absent
        (hbm(), 1.0),
        (host(0.2, 1.0), 0.8),  # 1 − 0.2 / 1.0
        (host(0.05, 0.2), 0.75),
        (host(2.0, 1.0), 0.0),  # a restore slower than recompute saves nothing (clamped)
        (host(0.1, 0.0), 0.0),  # nothing to recompute
        (hbm(model="other"), 0.0),  # KV of another model of the session does not count
    ],
)
def test_kv_locality(kv: SessionKvStatus | None, expected: float) -> None:
    assert kv_locality(REQ, status(kv=kv), CONFIG) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("load", "expected"),
    [
        ({}, 1.0),  # idle
        ({"waiting_prompt_tokens": 8192}, 0.5),  # load 1: one prefill step queued
        ({"running_calls": 32}, 0.5),
        ({"kv_utilization": 0.5}, 1 / 1.5),
        ({"reserved": {"other": 100e9}}, 0.5),
        ({"reserved": {"s": 1e12}}, 1.0),  # the session's own reservation is not pressure
        (
            {
                "waiting_prompt_tokens": 16384,  # 2
                "running_calls": 16,  # 0.5
                "kv_utilization": 0.25,  # 0.25
                "reserved": {"s": 1e12, "x": 30e9, "y": 20e9},  # 0.5
            },
            1 / 4.25,
        ),
    ],
)
def test_instance_pressure(load: dict[str, Any], expected: float) -> None:
    assert instance_pressure(REQ, status(**load), CONFIG) == pytest.approx(expected)


# -- picker: ties ----------------------------------------------------------------------------
def test_exact_ties_are_broken_by_the_seeded_rng_and_any_tied_instance_can_win() -> None:
    statuses = [status("b"), status("a"), status("c")]
    winners = set()
    for seed in range(64):
        first = route("talaria", REQ, statuses, CONFIG, random.Random(seed))
        again = route("talaria", REQ, list(reversed(statuses)), CONFIG, random.Random(seed))
        assert first.reason == "tie-break"
        assert first.instance == again.instance  # order of the input does not matter
        winners.add(first.instance)
    assert winners == {"a", "b", "c"}


def test_the_rng_is_drawn_only_on_a_tie() -> None:
    rng = random.Random(7)
    state = rng.getstate()
    route("talaria", REQ, [status("a"), status("b", kv=hbm())], CONFIG, rng)
    assert rng.getstate() == state


# -- picker: reasons -------------------------------------------------------------------------
HOST_10: dict[str, Any] = {"state": ModelState.HOST, "next_slot_in_s": 10.0}


@pytest.mark.parametrize(
    ("a", "b", "winner", "reason"),
    [
        ({}, {"kv": hbm()}, "b", "kv-hbm"),
        ({}, {"kv": host(0.1, 1.0)}, "b", "kv-host"),
        ({}, HOST_10, "a", "model-active"),
        (
            {"state": ModelState.STAGED, "next_slot_in_s": 1.0},
            {"state": ModelState.HOST, "next_slot_in_s": 30.0},
            "a",
            "model-staged",
        ),
        (
            {"state": ModelState.HOST, "next_slot_in_s": 5.0},
            {"state": ModelState.HOST, "next_slot_in_s": 40.0},
            "a",
            "model-host",
        ),
        ({"running_calls": 32}, {}, "b", "least-loaded"),
        # KV in HBM beats an active model on a busy node and a cold idle one
        ({**HOST_10}, {"kv": hbm(), "running_calls": 64}, "b", "kv-hbm"),
    ],
)
def test_reason_names_the_scorer_that_separates_winner_and_runner_up(
    a: dict[str, Any], b: dict[str, Any], winner: str, reason: str
) -> None:
    decision = route("talaria", REQ, [status("a", **a), status("b", **b)], CONFIG, random.Random(0))
    assert (decision.instance, decision.reason, decision.router) == (winner, reason, "talaria")


def test_scores_report_every_scorer_and_the_weighted_total() -> None:
    decision = route(
        "talaria",
        REQ,
        [status("a", **HOST_10), status("b", kv=host(0.2, 1.0), running_calls=32)],
        CONFIG,
        random.Random(0),
    )
    assert decision.scores == {
        "a": pytest.approx(
            {
                "model_residency": 0.5,
                "kv_locality": 0.0,
                "parent_kv": 0.0,
                "instance_pressure": 1.0,
                "model_affinity": 1.0,
                "total": 1.5,
            }
        ),
        "b": pytest.approx(
            {
                "model_residency": 1.0,
                "kv_locality": 0.8,
                "parent_kv": 0.0,
                "instance_pressure": 0.5,
                "model_affinity": 1.0,
                "total": 2.55,
            }
        ),
    }
    assert decision.instance == "b" and decision.reason == "kv-host"  # 0.8 > 0.5 > −0.25


# -- routers ---------------------------------------------------------------------------------
def test_only_candidate_filters_by_model() -> None:
    other = status("x", models={"n": ModelResidency("n", ModelState.ACTIVE, 0.0)})
    for router in ROUTER_NAMES:
        decision = route(
            router, REQ, [other, status("a", running_calls=99)], CONFIG, random.Random()
        )
        assert (decision.instance, decision.reason) == ("a", "only-candidate")
        assert set(decision.scores) == {"a"}


def test_no_candidate_and_unknown_router_errors_name_the_problem() -> None:
    with pytest.raises(NoInstanceError, match="'m'"):
        route("talaria", REQ, [status(models={})], CONFIG, random.Random(0))
    with pytest.raises(NoInstanceError, match="'m'"):
        route("talaria", REQ, [], CONFIG, random.Random(0))
    with pytest.raises(ValueError, match=r"talaria, load-only, sticky, kv-aware"):
        route("fastest", REQ, [status()], CONFIG, random.Random(0))


def test_talaria_goes_to_the_live_reservation_without_scoring_but_reports_scores() -> None:
    request = RouteRequest("s", "m", 1000, last_instance="a", reserved_instance="b")
    statuses = [status("a", kv=hbm()), status("b", **HOST_10, running_calls=64)]
    decision = route("talaria", request, statuses, CONFIG, random.Random(0))
    assert (decision.instance, decision.reason) == ("b", "reserved")
    assert decision.scores["a"]["total"] > decision.scores["b"]["total"]
    # a reservation on an instance that is not a candidate is ignored
    gone = RouteRequest("s", "m", 1000, reserved_instance="zz")
    assert route("talaria", gone, statuses, CONFIG, random.Random(0)).reason == "kv-hbm"
    # the other routers ignore reservations
    for router in ("load-only", "kv-aware"):
        assert route(router, request, statuses, CONFIG, random.Random(0)).reason != "reserved"


def test_sticky_returns_to_the_last_instance_else_least_loaded() -> None:
    statuses = [status("a", running_calls=64), status("b")]
    back = RouteRequest("s", "m", 1000, last_instance="a")
    assert route("sticky", back, statuses, CONFIG, random.Random(0)).instance == "a"
    assert route("sticky", back, statuses, CONFIG, random.Random(0)).reason == "sticky"
    new = RouteRequest("s", "m", 1000, last_instance="gone")
    decision = route("sticky", new, statuses, CONFIG, random.Random(0))
    assert (decision.instance, decision.reason) == ("b", "least-loaded")
    assert set(decision.scores["a"]) == {"instance_pressure", "total"}


def test_load_only_ignores_kv_and_residency() -> None:
    statuses = [status("a", kv=hbm(), running_calls=1), status("b", **HOST_10)]
    decision = route("load-only", REQ, statuses, CONFIG, random.Random(0))
    assert (decision.instance, decision.reason) == ("b", "least-loaded")
    assert set(decision.scores["a"]) == {"instance_pressure", "total"}


def test_kv_aware_follows_kv_but_not_residency() -> None:
    statuses = [status("a"), status("b", kv=hbm(), state=ModelState.HOST, next_slot_in_s=60)]
    decision = route("kv-aware", REQ, statuses, CONFIG, random.Random(0))
    assert (decision.instance, decision.reason) == ("b", "kv-hbm")
    assert "model_residency" not in decision.scores["a"]
    # without KV anywhere, residency does not matter: equal load is a tie
    cold = [status("a"), status("b", state=ModelState.HOST, next_slot_in_s=60)]
    assert route("kv-aware", REQ, cold, CONFIG, random.Random(0)).reason == "tie-break"


def test_weights_come_from_the_config() -> None:
    statuses = [status("a", **HOST_10), status("b", running_calls=32)]
    assert route("talaria", REQ, statuses, CONFIG, random.Random(0)).instance == "b"
    pressure_first = RoutingConfig(
        talaria=ScorerWeights(
            model_residency=0.1, kv_locality=1.0, instance_pressure=1.0, model_affinity=0.0
        )
    )
    assert route("talaria", REQ, statuses, pressure_first, random.Random(0)).instance == "a"
    with pytest.raises(ValueError, match=">= 0"):
        ScorerWeights(instance_pressure=-1.0)
    with pytest.raises(ValueError, match="residency_tau_s"):
        RoutingConfig(residency_tau_s=0.0)
