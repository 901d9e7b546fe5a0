"""The market workload generator (sim/market.py): shares, arrival statistics, groups, sessions."""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections import Counter

import pytest

from talaria.sim.market import (
    AI_PING_HEAD,
    MarketSpec,
    aegaeon_head,
    draw_cv,
    draw_groups,
    market_arrivals,
    market_sessions,
    model_arrivals,
    window_multipliers,
)
from talaria.sim.workload import PAPER_WORKLOAD

MODELS = tuple(f"m{j:02d}" for j in range(24))


@pytest.mark.parametrize(
    ("n", "head", "expected_first"),
    [
        (24, AI_PING_HEAD, (0.32, 0.20, 0.15, 0.11, 0.09)),
        (5, AI_PING_HEAD, (0.32 / 0.87, 0.20 / 0.87, 0.15 / 0.87, 0.11 / 0.87, 0.09 / 0.87)),
        (3, AI_PING_HEAD, (0.32 / 0.67, 0.20 / 0.67, 0.15 / 0.67)),
        (24, aegaeon_head(), (0.9865 * 0.32 / 0.67, 0.9865 * 0.20 / 0.67, 0.9865 * 0.15 / 0.67)),
    ],
)
def test_shares_are_the_head_then_a_zipf_tail(
    n: int, head: tuple[float, ...], expected_first: tuple[float, ...]
) -> None:
    shares = MarketSpec(MODELS[:n], head=head).shares()
    assert sum(shares.values()) == pytest.approx(1.0)
    assert tuple(shares[m] for m in MODELS[: len(expected_first)]) == pytest.approx(expected_first)
    tail = [shares[m] for m in MODELS[len(head) : n]]
    if tail:  # Zipf(1) over the tail ranks: share_r ∝ 1 / (r + 1)
        assert tail[0] / tail[-1] == pytest.approx(len(tail))
        assert sum(tail) == pytest.approx(1.0 - sum(head))


def test_aegaeon_head_carries_98_65_percent_on_three_models() -> None:
    shares = MarketSpec(MODELS, head=aegaeon_head()).shares()
    assert sum(shares[m] for m in MODELS[:3]) == pytest.approx(0.9865)
    assert sum(shares[m] for m in MODELS[3:]) == pytest.approx(0.0135)


def test_cv_draws_have_the_stated_median_and_p90() -> None:
    rng = random.Random(0)
    spec = MarketSpec(MODELS)
    cvs = sorted(draw_cv(spec, rng) for _ in range(20_000))
    assert statistics.median(cvs) == pytest.approx(1.2, rel=0.05)
    assert cvs[int(0.9 * len(cvs))] == pytest.approx(5.0, rel=0.08)


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gaps_at_a_constant_rate_keep_the_models_cv_and_rate(cv: float) -> None:
    spec = MarketSpec(
        ("m",), sessions_per_s=2.0, duration_s=20_000.0, head=(1.0,), cv_median=cv,
        cv_p90=cv * 1.000001, swing=(1.0, 1.0), diurnal_amplitude=0.0,
    )  # fmt: skip
    times = model_arrivals(spec, 1.0, [1.0] * 40, random.Random(3))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) / spec.duration_s == pytest.approx(2.0, rel=0.1 * cv)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.15)


def test_window_multipliers_average_one_within_the_swing() -> None:
    spec = MarketSpec(MODELS)
    values = window_multipliers(spec, random.Random(1), 50_000)
    assert statistics.fmean(values) == pytest.approx(1.0, rel=0.02)
    mean = (5.0 - 0.2) / math.log(25.0)
    assert min(values) >= 0.2 / mean and max(values) <= 5.0 / mean


def test_mean_sessions_over_seeds_match_the_rate_and_shares() -> None:
    spec = MarketSpec(MODELS, sessions_per_s=0.2, duration_s=3600.0)
    counts: Counter[str] = Counter()
    seeds = range(60)
    for seed in seeds:
        counts.update(m for _, m in market_arrivals(spec, seed))
    expected = spec.sessions_per_s * spec.duration_s
    assert sum(counts.values()) / len(seeds) == pytest.approx(expected, rel=0.1)
    head = MODELS[0]
    assert counts[head] / len(seeds) == pytest.approx(0.32 * expected, rel=0.2)
    # the tail's few sessions are not inflated by the start (stationary from t = 0)
    tail = sum(counts[m] for m in MODELS[5:]) / len(seeds)
    assert tail == pytest.approx(0.13 * expected, rel=0.2)


def test_groups_are_disjoint_and_share_their_window_multipliers() -> None:
    spec = MarketSpec(MODELS, groups=3)
    groups = draw_groups(spec, random.Random(5))
    members = [j for g in groups for j in g]
    assert len(groups) == 3 and len(set(members)) == len(members)
    assert all(3 <= len(g) <= 5 for g in groups)
    assert draw_groups(MarketSpec(MODELS[:4], groups=3), random.Random(5)) != []
    assert len(draw_groups(MarketSpec(MODELS[:2], groups=3), random.Random(5))) == 0


def test_a_models_arrivals_depend_on_its_own_stream_only() -> None:
    one = MarketSpec(MODELS, groups=0)
    other = MarketSpec(MODELS, groups=0, head=(0.32, 0.2, 0.15, 0.11, 0.09))
    a = [t for t, m in market_arrivals(one, 7) if m == "m00"]
    b = [t for t, m in market_arrivals(other, 7) if m == "m00"]
    assert a == b and a
    assert market_arrivals(one, 7) == market_arrivals(one, 7)
    assert market_arrivals(one, 7) != market_arrivals(one, 8)


def test_sessions_are_the_arrivals_with_agent_bodies() -> None:
    spec = MarketSpec(MODELS, sessions_per_s=0.1, duration_s=1800.0)
    windows = dict.fromkeys(MODELS, 131_072)
    sessions = market_sessions(spec, PAPER_WORKLOAD, windows, {}, 4)
    arrivals = market_arrivals(spec, 4)
    assert [(s.start_s, s.model) for s in sessions] == arrivals
    assert [s.session_id for s in sessions] == [f"s{k:04d}" for k in range(len(arrivals))]
    assert all(s.calls and s.calls[0].prompt_tokens >= 1 for s in sessions)
    assert all(c.model == s.model for s in sessions for c in s.calls)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"models": ()},
        {"models": ("a", "a")},
        {"sessions_per_s": 0.0},
        {"head": (0.7, 0.5)},
        {"cv_median": 6.0},
        {"swing": (2.0, 5.0)},
        {"diurnal_amplitude": 1.0},
    ],
)
def test_bad_markets_are_refused(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"models": MODELS} | kwargs
    with pytest.raises(ValueError):
        MarketSpec(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["market", "market-aegaeon"])
def test_market_presets_list_every_model_and_draw_their_sessions(name: str) -> None:
    from talaria.core.catalog import load_catalog
    from talaria.sim.presets import get_preset

    preset = get_preset(name)
    catalog = load_catalog()
    sessions = preset.sessions(catalog, 0)
    assert preset.market is not None and preset.market.models == preset.workload.models
    assert len(preset.workload.models) == 24
    assert all(catalog.find(m) is not None for m in preset.workload.models)
    assert {s.model for s in sessions} <= set(preset.workload.models)
    assert sessions == preset.sessions(load_catalog(), 0)
    fewer = preset.with_sessions(60)
    assert fewer.market is not None
    assert fewer.market.sessions_per_s * fewer.market.duration_s == pytest.approx(60)
