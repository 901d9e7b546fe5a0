"""The demand the placement controller reads (core/placement/demand.py): distinct sessions
per model with a call in the window, and the mean duration of the calls that finished in it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from talaria.core.placement import DemandMeter

WINDOW_S = 300.0


@pytest.mark.parametrize(
    ("arrivals", "now_s", "expected"),
    [
        ([], 0.0, {}),
        ([(0.0, "a", "s1"), (1.0, "a", "s1"), (2.0, "a", "s2")], 10.0, {"a": 2.0}),  # distinct
        ([(0.0, "a", "s1"), (5.0, "b", "s1")], 10.0, {"a": 1.0, "b": 1.0}),  # per model
        ([(0.0, "a", "s1"), (200.0, "a", "s2")], 300.0, {"a": 2.0}),  # the window's edge counts
        ([(0.0, "a", "s1"), (200.0, "a", "s2")], 301.0, {"a": 1.0}),  # ... and then leaves
        ([(0.0, "a", "s1")], 400.0, {}),  # nothing left: no demand, not zero
    ],
)
def test_demand_counts_distinct_sessions_in_the_window(
    arrivals: list[tuple[float, str, str]], now_s: float, expected: dict[str, float]
) -> None:
    meter = DemandMeter(WINDOW_S)
    for at_s, model, session in arrivals:
        meter.arrived(at_s, model, session)
    assert meter.demand(now_s) == expected


def test_call_s_is_the_mean_of_calls_finished_in_the_window() -> None:
    meter = DemandMeter(WINDOW_S)
    meter.finished(0.0, "a", 100.0)
    meter.finished(100.0, "a", 10.0)
    meter.finished(150.0, "b", 4.0)
    assert meter.call_s(200.0) == {"a": 55.0, "b": 4.0}
    assert meter.call_s(350.0) == {"a": 10.0, "b": 4.0}  # the first left the window
    assert meter.call_s(1000.0) == {}


calls = st.lists(
    st.tuples(st.floats(0, 1000, allow_nan=False), st.sampled_from("ab"), st.sampled_from("stuv")),
    max_size=40,
)


@given(calls, st.lists(st.floats(0, 1500, allow_nan=False), min_size=1, max_size=5))
def test_demand_matches_a_recount_at_every_read(
    arrivals: list[tuple[float, str, str]], reads: list[float]
) -> None:
    """Read at increasing times, after every arrival up to then (times never go back)."""
    meter = DemandMeter(WINDOW_S)
    pending = sorted(arrivals)
    for now_s in sorted(reads):
        while pending and pending[0][0] <= now_s:
            meter.arrived(*pending.pop(0))
        seen = [a for a in sorted(arrivals) if now_s - WINDOW_S <= a[0] <= now_s]
        recount = {
            m: float(len({s for _, mm, s in seen if mm == m})) for m in {m for _, m, _ in seen}
        }
        assert meter.demand(now_s) == recount


@pytest.mark.parametrize(
    ("window_s", "demand", "call_s", "finished"),
    [
        (None, {"a": 2.0, "b": 1.0}, {"a": 55.0, "b": 4.0}, {"a": 2, "b": 1}),  # the meter's
        (10_000.0, {"a": 2.0, "b": 1.0}, {"a": 55.0, "b": 4.0}, {"a": 2, "b": 1}),  # capped
        (120.0, {"a": 1.0, "b": 1.0}, {"a": 10.0, "b": 4.0}, {"a": 1, "b": 1}),
        (40.0, {}, {}, {}),
    ],
)
def test_a_read_may_take_a_shorter_window(
    window_s: float | None,
    demand: dict[str, float],
    call_s: dict[str, float],
    finished: dict[str, int],
) -> None:
    meter = DemandMeter(WINDOW_S)
    for at_s, model, session in [(0.0, "a", "s1"), (100.0, "a", "s2"), (150.0, "b", "s3")]:
        meter.arrived(at_s, model, session)
    meter.finished(0.0, "a", 100.0)
    meter.finished(100.0, "a", 10.0)
    meter.finished(150.0, "b", 4.0)
    assert meter.demand(200.0, window_s) == demand
    assert meter.call_s(200.0, window_s) == call_s
    assert meter.finished_calls(200.0, window_s) == finished


def test_calls_that_fell_out_of_the_window_are_forgotten_as_calls_come() -> None:
    meter = DemandMeter(WINDOW_S)
    for i in range(1_000):
        meter.arrived(float(i), "a", f"s{i}")
        meter.finished(float(i), "a", 1.0)
    assert len(meter._arrivals) == len(meter._finished) == int(WINDOW_S) + 1
