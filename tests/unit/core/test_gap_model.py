"""The one gap model (core/gap_model.py): the mean rule and the log-normal behind one protocol,
and the accumulator of how well each predicts; the node's status carries its figures."""

from __future__ import annotations

import math
import random

import pytest

from talaria.core.gap_model import (
    DEFAULT_GAP_PRIOR_S,
    LOG_NORMAL,
    MEAN,
    GapFigures,
    GapModel,
    GapQuality,
    LogNormalGaps,
    MeanGaps,
    slack_hold_s,
)
from talaria.core.gaps import LogNormalFit, PopulationGaps, SessionGaps, predict_session
from talaria.core.protocol_status import status_from_dict, status_to_dict
from talaria.runtime.scheduling.sessions import NodeSessions
from tests.unit.runtime.scheduling.scenarios import (
    LEARNED,
    OUT,
    P0,
    SP_SOFT,
    Agent,
    Call,
    run_probed,
)

KEY = ("t", "m", "")


@pytest.mark.parametrize(
    ("gaps", "expected"),
    [
        ((), DEFAULT_GAP_PRIOR_S),  # the prior alone
        ((1.2,), (DEFAULT_GAP_PRIOR_S + 1.2) / 2),
        ((1.0, 2.0, 3.0), (DEFAULT_GAP_PRIOR_S + 6.0) / 4),
        ((-5.0,), DEFAULT_GAP_PRIOR_S / 2),  # negative gaps count as 0
    ],
)
def test_the_mean_model_blends_its_prior(gaps: tuple[float, ...], expected: float) -> None:
    model = MeanGaps()
    for gap in gaps:
        model.observe(gap)
    assert model.count == len(gaps)
    assert model.expected_s() == pytest.approx(expected)
    for q in (0.5, 0.95, 0.99):  # the slack rule, whatever q
        assert model.hold_s(q) == pytest.approx(max(2 * expected, expected + 1.0))


def test_the_mean_models_prior_weight() -> None:
    model = MeanGaps(prior_s=10.0, prior_weight=3.0)
    assert model.expected_s() == 10.0
    model.observe(2.0)
    assert model.expected_s() == pytest.approx((10.0 * 3 + 2.0) / 4)


@pytest.mark.parametrize(
    ("gap", "hold"), [(0.2, 1.2), (0.5, 1.5), (1.0, 2.0), (3.2, 6.4), (10.0, 20.0)]
)
def test_the_slack_rule(gap: float, hold: float) -> None:
    assert slack_hold_s(gap) == pytest.approx(hold)


@pytest.mark.parametrize(
    ("gaps", "quantile"),
    [((), 0.95), ((0.05,) * 5, 0.95), ((30.0, 40.0), 0.9), ((0.3, 12.0, 2.0), 0.99)],
)
def test_the_log_normal_model_is_core_gaps_blend(gaps: tuple[float, ...], quantile: float) -> None:
    population = PopulationGaps()
    model = LogNormalGaps(population, KEY)
    own, fit = SessionGaps(), LogNormalFit.prior()
    for gap in gaps:
        model.observe(gap)
        own.observe(gap)
        fit.observe(gap)
    want = predict_session(own, fit, quantile=quantile)
    assert model.expected_s() == pytest.approx(want.median_s)
    assert model.hold_s(quantile) == pytest.approx(want.hold_s)
    assert model.hold_s(quantile) >= model.expected_s() + 1.0
    assert (KEY in population) == bool(gaps)


def test_reading_the_log_normal_model_marks_no_population_used() -> None:
    population = PopulationGaps()
    first, second = LogNormalGaps(population, ("a", "m", "")), LogNormalGaps(population, KEY)
    first.observe(1.0)
    second.observe(1.0)
    first.hold_s(0.95)  # a read: the order stays
    assert population.held_keys() == [("a", "m", ""), KEY]
    first.prediction(0.95, touch=True)  # the node's hold: marks it used
    assert population.held_keys() == [KEY, ("a", "m", "")]


def test_both_models_are_gap_models() -> None:
    models: list[GapModel] = [MeanGaps(), LogNormalGaps(PopulationGaps(), KEY)]
    assert [m.name for m in models] == [MEAN, LOG_NORMAL]


@pytest.mark.parametrize(
    ("observed", "n", "median", "coverage"),
    [
        ([], 0, None, None),
        ([(1.0, 1.0, 2.0)], 1, 0.0, 1.0),
        ([(math.e, 1.0, 2.0)], 1, 1.0, 0.0),  # |ln e − ln 1| = 1; e > its 2 s hold
        ([(1.0, math.e, 5.0), (math.e**2, 1.0, 5.0)], 2, 1.5, 0.5),  # the middle two's mean
        ([(2.0, 1.0, 3.0), (0.5, 1.0, 3.0), (8.0, 1.0, 3.0)], 3, round(math.log(2), 3), 2 / 3),
        ([(0.0, 1.0, 1.0)], 1, round(-math.log(1e-3), 3), 1.0),  # a 0 s gap floored at 1 ms
    ],
)
def test_the_accumulator(
    observed: list[tuple[float, float, float]],
    n: int,
    median: float | None,
    coverage: float | None,
) -> None:
    quality = GapQuality(0.9)
    for gap, expected, hold in observed:
        quality.observe(gap, expected, hold)
    figures = quality.figures()
    assert figures.n == n and figures.quantile == 0.9
    if median is None:
        assert figures.median_abs_log_error is None
    else:
        assert figures.median_abs_log_error == pytest.approx(median, abs=1e-3)
    assert figures.coverage == (None if coverage is None else pytest.approx(coverage))


def test_merged_accumulators_count_every_gap() -> None:
    one, two, both = GapQuality(), GapQuality(), GapQuality()
    for i, gap in enumerate([0.1, 0.4, 2.0, 9.0, 30.0]):
        (one if i % 2 else two).observe(gap, 1.0, 5.0)
        both.observe(gap, 1.0, 5.0)
    one.merge(two)
    assert one.figures() == both.figures()
    with pytest.raises(ValueError, match="quantiles differ"):
        one.merge(GapQuality(0.5))


def _heavy_tailed(quantile: float) -> dict[str, GapFigures]:
    """100 sessions of 20 log-normal gaps each (σ = 1.2, the session's median around 2 s),
    seeded; each model judged before it sees each gap."""
    rng = random.Random(7)
    population = PopulationGaps()
    quality = {MEAN: GapQuality(quantile), LOG_NORMAL: GapQuality(quantile)}
    for _ in range(100):
        log_median = rng.gauss(math.log(2.0), 0.5)
        models: list[GapModel] = [MeanGaps(), LogNormalGaps(population, KEY)]
        for _ in range(20):
            gap = math.exp(rng.gauss(log_median, 1.2))
            for model in models:
                quality[model.name].judge(model, gap)
                model.observe(gap)
    return {name: q.figures() for name, q in quality.items()}


@pytest.mark.parametrize("quantile", [0.9, 0.95, 0.99])
def test_on_heavy_tailed_gaps_only_the_log_normal_covers_its_quantile(quantile: float) -> None:
    figures = _heavy_tailed(quantile)
    mean, learned = figures[MEAN], figures[LOG_NORMAL]
    assert mean.n == learned.n == 2000
    assert mean.coverage is not None and mean.coverage < 0.86  # 2 × the mean: ≈ 0.84 at any q
    assert learned.coverage == pytest.approx(quantile, abs=0.02)
    assert learned.median_abs_log_error is not None and mean.median_abs_log_error is not None
    assert learned.median_abs_log_error < mean.median_abs_log_error


def test_the_node_judges_each_gap_with_the_models_it_keeps() -> None:
    assert set(NodeSessions().quality) == {MEAN}
    assert set(NodeSessions(PopulationGaps(), 0.9).quality) == {MEAN, LOG_NORMAL}
    assert NodeSessions(PopulationGaps(), 0.9).gap_figures()[LOG_NORMAL] == GapFigures(quantile=0.9)


@pytest.mark.parametrize(("flags", "models"), [(SP_SOFT, {MEAN}), (LEARNED, {MEAN, LOG_NORMAL})])
def test_the_nodes_status_carries_its_gap_models(flags: object, models: set[str]) -> None:
    """Four calls, three tool gaps of 0.05 s: the status after them counts three gaps per
    model, and the figures cross the wire."""
    agent = Agent("s1", "a", 0.0, tuple(Call(P0 + 100 * i, OUT, gap_s=0.05) for i in range(4)))
    _, _, statuses = run_probed(flags, (agent,), (600.0,))
    status = statuses[-1]
    assert set(status.gap_models) == models
    for figures in status.gap_models.values():
        assert figures.n == 3 and figures.quantile == 0.95
        assert figures.coverage == 1.0  # every hold ≥ 1 s, every gap 0.05 s
    document = status_to_dict(status, model_names=["a"], slots=[], engines={})
    assert status_from_dict(document).gap_models == status.gap_models
