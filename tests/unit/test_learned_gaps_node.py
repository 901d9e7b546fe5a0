"""The node scheduler's soft reservations with and without ``learned_gaps`` (core/gaps.py), on
the tiny catalog of test_scheduler_scenarios.py, and a small replay of ``talaria`` against
``talaria-learned``. Virtual time; no sleeps."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest

from talaria.core.catalog import load_catalog
from talaria.core.gaps import LogNormalFit, SessionGaps, predict_session
from talaria.core.reservations import DEFAULT_GAP_PRIOR_S, ReleaseReason
from talaria.core.types import DEFAULT_TENANT, CallResult
from talaria.runtime.factory import NodeSetup
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import SchedulerFlags
from talaria.runtime.scheduling.slots import CloseReason
from talaria.sim.experiment import ExperimentSetup, run_experiment
from talaria.sim.policies import resolve_policy
from talaria.sim.replay import replay
from talaria.sim.workload import WorkloadSpec, generate_sessions
from tests.unit.test_scheduler_scenarios import (
    COST_A,
    COST_B,
    ONE_CALL_B,
    OUT,
    P0,
    Agent,
    Call,
    approx,
    lone_call_s,
    ok,
    plain_switch_s,
    run_scenario,
)

SP_SOFT = SchedulerFlags(sp_admission=True, soft_reservations=True)
LEARNED = replace(SP_SOFT, learned_gaps=True)
PRIOR = predict_session(SessionGaps(), LogNormalFit.prior())
T_A0 = COST_A.weight_wake_time_s() + lone_call_s(COST_A, P0, OUT)


@pytest.mark.parametrize(
    ("flags", "hint_s", "hold_s"),
    [
        # without the flag: the mean rule, max(2 × gap, gap + 1 s), the prior mean 3.2 s
        (SP_SOFT, None, max(2 * DEFAULT_GAP_PRIOR_S, DEFAULT_GAP_PRIOR_S + 1.0)),
        # with it: the prior log-normal's 0.9-quantile, exp(μ0 + 1.2816 σ0) ≈ 3.53 s
        (LEARNED, None, PRIOR.hold_s),
        # a hint still wins, with the mean rule
        (LEARNED, 2.0, 4.0),
        (SP_SOFT, 2.0, 4.0),
    ],
    ids=["mean", "learned", "learned-hinted", "mean-hinted"],
)
def test_reservation_of_a_session_that_never_returns_is_held_by_the_rule(
    flags: SchedulerFlags, hint_s: float | None, hold_s: float
) -> None:
    gone = Agent("s1", "a", 0.0, (Call(P0, OUT, hint_s=hint_s),), ends=False)
    node, out = run_scenario(flags, (gone, ONE_CALL_B))
    assert ok(out["s1"], 0).finished_s == approx(T_A0)
    t_expiry = T_A0 + hold_s
    assert node.slots[0].close is CloseReason.IDLE
    assert node.slots[0].end_s == approx(t_expiry)
    assert ok(out["s2"], 0).admitted_s == approx(t_expiry + plain_switch_s(COST_A, COST_B))
    assert node.reservations.released[ReleaseReason.EXPIRED] == 1
    assert PRIOR.hold_s == pytest.approx(3.5269, rel=1e-4)


def test_learned_median_before_the_deadline_reserves_where_the_mean_would_not() -> None:
    """The slot's deadline falls 2 s after the call: the prior mean (3.2 s) is past it, so the
    mean rule takes no reservation and the slot closes idle; the learned median (0.48 s) is
    before it, so the session holds the slot until the deadline closes it."""
    quantum = T_A0 - COST_A.weight_wake_time_s() + 2.0
    gone = Agent("s1", "a", 0.0, (Call(P0, OUT),), ends=False)
    deadline = COST_A.weight_wake_time_s() + quantum

    node, _ = run_scenario(SP_SOFT, (gone, ONE_CALL_B), quantum_s=quantum)
    assert node.slots[0].close is CloseReason.IDLE
    assert node.slots[0].end_s == approx(T_A0)
    assert sum(node.reservations.released.values()) == 0

    node, _ = run_scenario(LEARNED, (gone, ONE_CALL_B), quantum_s=quantum)
    assert node.slots[0].close is CloseReason.QUANTUM
    assert node.slots[0].end_s == approx(deadline)
    assert node.reservations.released[ReleaseReason.SLOT_CLOSED] == 1


def test_the_node_learns_the_sessions_gaps_and_holds_by_them() -> None:
    """Five quick tools (0.05 s) then a call whose session never returns: the last hold is
    the prediction from the five gaps, in the session and in its (tenant, model) population."""
    gaps = [0.05] * 5
    calls = (*(Call(P0 + 100 * i, OUT, gap_s=0.05) for i in range(5)), Call(P0 + 500, OUT))
    agent = Agent("s1", "a", 0.0, calls, ends=False)
    node, out = run_scenario(LEARNED, (agent, ONE_CALL_B))
    fit, session = LogNormalFit.prior(), SessionGaps()
    for g in gaps:
        fit.observe(g)
        session.observe(g)
    learned = predict_session(session, fit)
    assert learned.median_s < 0.1 and learned.hold_s == pytest.approx(learned.median_s + 1.0)
    last = ok(out["s1"], 5).finished_s
    assert node.slots[0].end_s == approx(last + learned.hold_s)
    population = node._sessions.population  # the node's learned fits
    assert population is not None
    got = population.fit((DEFAULT_TENANT, "a"))
    assert got.n == pytest.approx(fit.n)
    assert got.mean == pytest.approx(fit.mean)
    assert node.reservations.released[ReleaseReason.RETURNED] == 5


def test_without_the_flag_the_node_keeps_no_population() -> None:
    node, _ = run_scenario(SP_SOFT, (ONE_CALL_B,))
    assert node._sessions.population is None


# -- a small replay --------------------------------------------------------------------------
CATALOG = load_catalog()
MODELS = ("glm-4.5-fp8", "qwen3-235b-a22b-bf16", "qwen3-coder-480b-a35b-fp8")
SPEC = WorkloadSpec(sessions=6, models=MODELS, total_calls=60, mean_interarrival_s=5.0)
WINDOWS = {m: CATALOG.model(m).context_window_tokens for m in MODELS}
REASONING = {m: CATALOG.model(m).reasoning for m in MODELS}


@pytest.mark.parametrize("seed", [0, 1])
def test_talaria_learned_replays_every_call_once(seed: int) -> None:
    sessions = generate_sessions(SPEC, WINDOWS, REASONING, seed)
    seen: list[CallResult] = []
    policy = resolve_policy("talaria-learned")
    assert policy.router == "talaria" and policy.flags.learned_gaps
    outcome = replay(
        sessions,
        CATALOG,
        [("node0", NodeSetup("h200x8", "default", MODELS))],
        policy.flags,
        SchedulerConfig(quantum_s=20.0),
        on_call=seen.append,
    )
    counts = Counter(r.request_id for r in seen)
    assert set(counts) == {f"{s.session_id}/{i}" for s in sessions for i in range(s.num_calls)}
    assert max(counts.values()) == 1
    assert len(outcome.sessions) == len(sessions)
    node = outcome.nodes[0]
    assert sum(node.reservations.values()) > 0 and node.reservation_byte_s > 0


TALARIA_PINNED: dict[str, object] = {
    # run_experiment(generate_sessions(SPEC, ..., 0), ..., ["talaria"]) with the code before
    # learned_gaps existed (commit daef010): learned_gaps off changes nothing.
    "p50_sct_s": 74.18851225838412,
    "p95_sct_s": 151.95428243898843,
    "reservations": {"returned": 48, "ended": 0, "expired": 6, "slot-closed": 0, "moved": 0},
}


def test_talaria_is_unchanged_and_the_document_gains_the_new_keys() -> None:
    sessions = generate_sessions(SPEC, WINDOWS, REASONING, 0)
    setup = ExperimentSetup("h200x8", "default", MODELS, nodes=1, quantum_s=20.0)
    doc = run_experiment(
        sessions, CATALOG, setup, ["talaria", "talaria-learned"], include_dedicated=False,
        include_oracle=False,
    )  # fmt: skip
    talaria, learned = doc["policies"]["talaria"], doc["policies"]["talaria-learned"]
    for key, value in TALARIA_PINNED.items():
        assert talaria[key] == value, key
    assert not talaria["flags"]["learned_gaps"] and learned["flags"]["learned_gaps"]
    for summary in (talaria, learned):
        assert summary["calls_completed"] == doc["calls"]
        assert summary["reservation_gb_s"] >= 0.0
        share = summary["reservations_expired_share"]
        expired, returned = summary["reservations"]["expired"], summary["reservations"]["returned"]
        assert share == (expired / (expired + returned) if expired + returned else None)
    assert math.isfinite(learned["p50_sct_s"])
