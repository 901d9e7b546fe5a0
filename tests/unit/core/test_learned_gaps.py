"""Tool gaps learned on the server (core/gaps.py, the ``learned_gaps`` flag): the prior, the
online fit, the per-session blend, the hold rule, the population bound, and the reservation
plan and accounting it feeds (core/holds.py). Seeded; no sleeps."""

from __future__ import annotations

import math
import random
from statistics import NormalDist

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talaria.core.gaps import (
    DEFAULT_CAP_S,
    DEFAULT_PRIOR_WEIGHT,
    DEFAULT_QUANTILE,
    GAP_MIXTURE,
    MIN_GAP_S,
    POOLED_AGENT,
    PRIOR_LOG_MEAN,
    PRIOR_LOG_SD,
    LogNormalFit,
    PopulationGaps,
    SessionGaps,
    mixture_log_moments,
    predict,
    predict_session,
)
from talaria.core.holds import HoldTable, ReleaseReason, plan_hold


def _mixture_draws(n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        _, median, sigma = GAP_MIXTURE[0] if rng.random() < 0.96 else GAP_MIXTURE[1]
        out.append(median * math.exp(sigma * rng.gauss(0.0, 1.0)))
    return out


# -- the prior -------------------------------------------------------------------------------
def test_prior_is_the_mixtures_log_moments() -> None:
    assert pytest.approx(-0.7374, abs=1e-4) == PRIOR_LOG_MEAN
    assert pytest.approx(1.5589, abs=1e-4) == PRIOR_LOG_SD
    assert mixture_log_moments(GAP_MIXTURE) == (PRIOR_LOG_MEAN, PRIOR_LOG_SD)
    logs = [math.log(g) for g in _mixture_draws(200_000, seed=1)]
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / len(logs))
    assert mean == pytest.approx(PRIOR_LOG_MEAN, abs=0.02)
    assert sd == pytest.approx(PRIOR_LOG_SD, abs=0.02)


@pytest.mark.parametrize(
    ("quantile", "expected_s"),
    [(0.5, 0.4783), (0.75, 1.3690), (0.9, 3.5269), (0.99, 17.9783)],
)
def test_prior_quantiles_are_the_fitted_log_normals(quantile: float, expected_s: float) -> None:
    """Before any gap, the hold is the fitted log-normal's quantile exp(μ0 + z_q σ0) (above the
    median + 1 s floor from q = 0.9 on)."""
    fit = LogNormalFit.prior()
    z = NormalDist().inv_cdf(quantile)
    assert math.exp(fit.mean + z * fit.sd) == pytest.approx(expected_s, rel=1e-3)
    got = predict_session(SessionGaps(), fit, quantile=quantile)
    assert got.median_s == pytest.approx(math.exp(PRIOR_LOG_MEAN))
    assert got.hold_s == pytest.approx(max(expected_s, got.median_s + 1.0), rel=1e-3)


# -- learning --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("median_s", "sigma", "seed"), [(2.0, 0.7, 0), (0.2, 1.2, 1), (30.0, 0.4, 2)]
)
def test_population_fit_converges_to_the_gaps_log_normal(
    median_s: float, sigma: float, seed: int
) -> None:
    rng = random.Random(seed)
    fit = LogNormalFit.prior()
    for _ in range(20_000):
        fit.observe(median_s * math.exp(sigma * rng.gauss(0.0, 1.0)))
    assert fit.n == DEFAULT_PRIOR_WEIGHT + 20_000
    assert fit.mean == pytest.approx(math.log(median_s), abs=0.03)
    # the prior's 20 observations still add k (σ0² + (μ − μ0)²) / n to the variance
    assert fit.sd == pytest.approx(sigma, abs=0.025)


def test_welford_matches_the_two_pass_moments_with_the_prior() -> None:
    gaps = [0.1, 0.5, 2.0, 40.0, 0.0]  # 0 is floored at MIN_GAP_S
    fit = LogNormalFit.prior(log_mean=0.0, log_sd=1.0, weight=2.0)
    for g in gaps:
        fit.observe(g)
    logs = [math.log(max(g, MIN_GAP_S)) for g in gaps]
    mean = sum(logs) / (2 + len(logs))
    # the prior's 2 observations sit at 0 with variance 1: Σ (x − mean)² = 2 (1 + mean²) + ...
    m2 = 2 * (1.0 + mean**2) + sum((x - mean) ** 2 for x in logs)
    assert fit.mean == pytest.approx(mean)
    assert fit.sd == pytest.approx(math.sqrt(m2 / (2 + len(logs))))


@pytest.mark.parametrize(
    ("own", "weight", "population_mean", "expected"),
    [
        ([], 3.0, -0.5, -0.5),  # no gap of its own: the population's mean
        ([1.0], 3.0, 0.0, 0.0),  # ln 1 = 0
        ([math.e**2] * 3, 3.0, 0.0, 1.0),  # (3·0 + 3·2) / 6
        ([math.e] * 97, 3.0, 0.0, 0.97),  # its own gaps dominate
    ],
)
def test_session_blends_its_gaps_with_its_population(
    own: list[float], weight: float, population_mean: float, expected: float
) -> None:
    session = SessionGaps()
    for g in own:
        session.observe(g)
    assert session.log_mean(population_mean, weight) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("gaps", "median_s", "hold_s"),
    [
        # quick tools: the hold shrinks to median + 1 s when the spread is small
        ([0.2] * 200, 0.2, 1.2),
        # a test run every time: held past the median, up to the q-quantile
        ([30.0] * 200, 30.0, None),
    ],
)
def test_learned_hold_follows_the_population(
    gaps: list[float], median_s: float, hold_s: float | None
) -> None:
    fit = LogNormalFit.prior()
    session = SessionGaps()
    for g in gaps:
        fit.observe(g)
        session.observe(g)
    got = predict_session(session, fit)
    assert got.median_s == pytest.approx(median_s, rel=0.05)
    z = NormalDist().inv_cdf(DEFAULT_QUANTILE)
    mu = session.log_mean(fit.mean)
    expected = hold_s if hold_s is not None else math.exp(mu + z * fit.sd)
    assert got.hold_s == pytest.approx(max(expected, got.median_s + 1.0), rel=0.05)
    assert got.hold_s >= got.median_s + 1.0


# -- the hold rule (property) ----------------------------------------------------------------
@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    log_mean=st.floats(-8.0, 8.0),
    log_sd=st.floats(0.0, 4.0),
    q1=st.floats(0.01, 0.99),
    q2=st.floats(0.01, 0.99),
    floor_s=st.floats(0.0, 5.0),
    cap_s=st.floats(1.0, 1000.0),
)
def test_hold_covers_the_median_and_the_floor_and_grows_with_q(
    log_mean: float, log_sd: float, q1: float, q2: float, floor_s: float, cap_s: float
) -> None:
    lo, hi = sorted((q1, q2))
    a = predict(log_mean, log_sd, quantile=lo, floor_s=floor_s, cap_s=cap_s)
    b = predict(log_mean, log_sd, quantile=hi, floor_s=floor_s, cap_s=cap_s)
    assert a.median_s == b.median_s == pytest.approx(math.exp(log_mean))
    for got in (a, b):
        assert got.hold_s >= got.median_s
        assert got.hold_s >= got.median_s + floor_s
        assert got.hold_s <= max(cap_s, got.median_s + floor_s)
    assert a.hold_s <= b.hold_s


def test_hold_is_capped_at_the_idle_timeout() -> None:
    assert predict(math.log(100.0), 3.0).hold_s == DEFAULT_CAP_S
    assert predict(math.log(900.0), 1.0).hold_s == pytest.approx(901.0)  # the floor wins
    with pytest.raises(ValueError, match="quantile"):
        predict(0.0, 1.0, quantile=1.0)


# -- the population bound --------------------------------------------------------------------
def _key(name: str | int, tenant: str = "t") -> tuple[str, str, str]:
    return (tenant, "m", str(name))


def test_population_keeps_at_most_max_keys_least_recently_used_out() -> None:
    pop = PopulationGaps(max_keys=3)
    a, b, c, d = (_key(n, tenant=n) for n in "abcd")  # a tenant each: no kind is pooled
    for key in (a, b, c):
        pop.observe(key, 0.1)
    pop.fit(a)  # a used: b is now the least recently used
    pop.observe(d, 0.1)
    assert len(pop) == 3
    assert b not in pop and pop.held_keys() == [c, a, d]
    assert pop.fit(b) == LogNormalFit.prior()  # an evicted key starts again from the prior
    assert b not in pop  # reading does not store
    for i in range(100):
        pop.observe(_key(i, tenant=str(i)), 1.0)
    assert len(pop) == 3
    with pytest.raises(ValueError, match="max_keys"):
        PopulationGaps(max_keys=0)
    with pytest.raises(ValueError, match="max_agents"):
        PopulationGaps(max_agents=0)


@pytest.mark.parametrize(
    ("max_agents", "seen", "asked", "learned_as"),
    [
        (2, ["x", "y"], "x", "x"),  # a kind of its own
        (2, ["x", "y"], "z", POOLED_AGENT),  # past the cap: pooled
        (2, ["x"], "z", "z"),  # room left: its own
        (1, ["x", "y", "z"], "y", POOLED_AGENT),
        (2, ["x", "y"], POOLED_AGENT, POOLED_AGENT),
    ],
)
def test_a_tenant_has_at_most_max_agents_kinds_of_its_own(
    max_agents: int, seen: list[str], asked: str, learned_as: str
) -> None:
    pop = PopulationGaps(max_agents=max_agents)
    for kind in seen:
        pop.observe(_key(kind), 1.0)
    assert pop.key_of(_key(asked)) == _key(learned_as)
    assert pop.key_of(_key(asked, tenant="other")) == _key(asked, tenant="other")


def test_rotating_agent_kinds_evicts_no_other_tenants_fit() -> None:
    """One tenant writing a new ``User-Agent`` on every call (issue 46): past its
    ``max_agents`` kinds they all feed its pooled fit, and the other tenants' fits stay."""
    pop = PopulationGaps(max_keys=16, max_agents=4)
    others = [_key("claude-cli", tenant=f"t{i}") for i in range(6)]
    for key in others:
        pop.observe(key, 30.0)
    for i in range(1000):
        pop.observe(_key(f"bot{i}", tenant="rotator"), 0.01)
    assert all(key in pop for key in others)
    rotator = [k for k in pop.held_keys() if k[0] == "rotator"]
    assert len(rotator) == 4 + 1
    assert pop.fit(_key("bot999", tenant="rotator")).n == DEFAULT_PRIOR_WEIGHT + 1000 - 4


def test_a_kind_frees_its_place_when_its_last_fit_is_evicted() -> None:
    pop = PopulationGaps(max_keys=2, max_agents=1)
    pop.observe(_key("x"), 1.0)
    pop.observe(_key("x", tenant="u"), 1.0)
    pop.observe(_key("y", tenant="v"), 1.0)  # evicts t's only fit of kind x
    assert pop.key_of(_key("y")) == _key("y")


# -- the reservation plan and its accounting -------------------------------------------------
@pytest.mark.parametrize(
    ("gap_s", "hold_s", "deadline_s", "expires_s"),
    [
        (0.5, None, None, 11.5),  # the mean rule: max(2 × 0.5, 0.5 + 1)
        (0.5, 3.5, None, 13.5),  # learned: now + hold
        (0.5, 3.5, 10.4, None),  # learned median return after the deadline: none
        (0.5, 30.0, 10.6, 40.0),  # median before the deadline: held to its hold
    ],
)
def test_plan_reservation_with_a_learned_hold(
    gap_s: float, hold_s: float | None, deadline_s: float | None, expires_s: float | None
) -> None:
    plan = plan_hold(
        session_key="s",
        model="m",
        now_s=10.0,
        expected_gap_s=gap_s,
        held_bytes=1.0,
        deadline_s=deadline_s,
        hold_gap_s=hold_s,
    )
    if expires_s is None:
        assert plan is None
    else:
        assert plan is not None
        assert plan.expected_return_s == pytest.approx(10.0 + gap_s)
        assert plan.expires_s == pytest.approx(expires_s)


def test_table_counts_memory_seconds_of_the_releases_with_a_time() -> None:
    table = HoldTable()
    for key, held in (("s1", 2e9), ("s2", 1e9), ("s3", 5e9)):
        plan = plan_hold(
            session_key=key, model="m", now_s=1.0, expected_gap_s=1.0, held_bytes=held,
            deadline_s=None,
        )  # fmt: skip
        assert plan is not None
        table.add(plan)
    table.release("s1", ReleaseReason.RETURNED, now_s=3.0)  # 2 GB × 2 s
    table.release("s2", ReleaseReason.EXPIRED, now_s=4.0)  # 1 GB × 3 s
    table.release("s3", ReleaseReason.ENDED)  # no time given: not counted
    assert table.held_byte_s == pytest.approx(7e9)
    assert table.released[ReleaseReason.RETURNED] == table.released[ReleaseReason.EXPIRED] == 1


def test_a_learned_extension_keeps_the_pin_and_drops_the_budget() -> None:
    """A learned hold (20 s) past the slack rule's (max(2 × 1 s, 1 s + 1 s) = 2 s): its budget
    counts for admission, and in the byte-seconds, only until slot_until_s; its pinned KV for
    as long as it lives."""
    table = HoldTable()
    plan = plan_hold(
        session_key="s", model="m", now_s=10.0, expected_gap_s=1.0, held_bytes=1e9,
        deadline_s=None, hold_gap_s=20.0, pinned_bytes=4e9,
    )  # fmt: skip
    assert plan is not None and (plan.slot_until_s, plan.expires_s) == (12.0, 30.0)
    table.add(plan)
    assert table.held_bytes() == table.held_bytes(now_s=11.9) == 1e9
    assert table.held_bytes(now_s=12.0) == 0.0
    assert table.held_bytes("s", now_s=11.0) == 0.0  # its own call's
    table.release("s", ReleaseReason.RETURNED, now_s=15.0)
    assert table.held_byte_s == pytest.approx(1e9 * 2.0)  # budget until 12 s
    assert table.pinned_byte_s == pytest.approx(4e9 * 5.0)  # pin until 15 s
