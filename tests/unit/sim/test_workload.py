"""Workload generator: determinism, the paper preset, invariants and the fitted statistics."""

from __future__ import annotations

import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talaria.core.trace import read_trace, write_trace
from talaria.sim.workload import (
    PAPER_WORKLOAD,
    WorkloadSpec,
    demand_weights,
    draw_bursts,
    draw_model_index,
    draw_num_calls,
    draw_output_tokens,
    draw_tool_gap,
    generate_sessions,
    rescale_counts,
)

WINDOWS = {m: 131_072 for m in PAPER_WORKLOAD.models}
N = 20_000


def _bytes(tmp_path: Path, seed: int, name: str) -> bytes:
    path = tmp_path / name
    write_trace(path, generate_sessions(PAPER_WORKLOAD, WINDOWS, {}, seed))
    return path.read_bytes()


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path) -> None:
    assert _bytes(tmp_path, 0, "a") == _bytes(tmp_path, 0, "b")
    assert _bytes(tmp_path, 0, "a") != _bytes(tmp_path, 1, "c")


def test_mapping_order_does_not_matter() -> None:
    windows = dict(reversed(list(WINDOWS.items())))
    thinks = {m: False for m in reversed(PAPER_WORKLOAD.models)}
    assert generate_sessions(PAPER_WORKLOAD, windows, thinks, 3) == generate_sessions(
        PAPER_WORKLOAD, WINDOWS, {}, 3
    )


def test_paper_preset(tmp_path: Path) -> None:
    sessions = generate_sessions(PAPER_WORKLOAD, WINDOWS, {}, 0)
    assert len(sessions) == 30
    assert sum(s.num_calls for s in sessions) == 960
    assert {s.model for s in sessions} <= set(PAPER_WORKLOAD.models)
    assert [s.session_id for s in sessions] == [f"s{k:04d}" for k in range(30)]
    starts = [s.start_s for s in sessions]
    assert starts[0] == 0.0 and starts == sorted(starts)
    for s in sessions:  # generated traces: every call carries the session start
        assert all(c.arrival_offset_s == s.start_s for c in s.calls)
    path = tmp_path / "paper.jsonl"
    write_trace(path, sessions)
    assert read_trace(path) == sessions


def test_arrival_sweep_keeps_sessions() -> None:
    base = generate_sessions(PAPER_WORKLOAD, WINDOWS, {}, 5)
    burst = generate_sessions(replace(PAPER_WORKLOAD, mean_interarrival_s=0.0), WINDOWS, {}, 5)
    slow = generate_sessions(replace(PAPER_WORKLOAD, mean_interarrival_s=20.0), WINDOWS, {}, 5)
    assert all(s.start_s == 0.0 for s in burst)
    for a, b, c in zip(base, burst, slow, strict=True):
        assert c.start_s == pytest.approx(2 * a.start_s, abs=1e-5)
        assert [x.prompt_tokens for x in a.calls] == [x.prompt_tokens for x in b.calls]
        assert [x.tool_gap_s for x in a.calls] == [x.tool_gap_s for x in c.calls]


def test_reasoning_models_write_more() -> None:
    spec = WorkloadSpec(sessions=200, models=("a",), mean_interarrival_s=0.0)
    plain = generate_sessions(spec, {"a": 10**9}, {"a": False}, 2)
    thinking = generate_sessions(spec, {"a": 10**9}, {"a": True}, 2)
    med = [
        statistics.median(c.output_tokens for s in ss for c in s.calls) for ss in (plain, thinking)
    ]
    assert med[0] == pytest.approx(150, rel=0.1)
    assert med[1] == pytest.approx(400, rel=0.1)


def test_window_cap_and_truncation() -> None:
    spec = WorkloadSpec(sessions=5, models=("tiny",), calls_median=60, c0_median=3000)
    window = 8_000
    for s in generate_sessions(spec, {"tiny": window}, {}, 11):
        prev_end = 0
        for c in s.calls:
            assert c.prompt_tokens + c.output_tokens <= window
            if c.call_index > 0 and c.prompt_tokens < prev_end:
                assert c.new_tokens == c.prompt_tokens  # truncation: nothing reused
            elif c.call_index > 0:
                assert c.new_tokens == c.prompt_tokens - prev_end
            prev_end = c.prompt_tokens + c.output_tokens
    truncated = [
        c
        for s in generate_sessions(spec, {"tiny": window}, {}, 11)
        for c in s.calls
        if c.call_index > 0 and c.new_tokens == c.prompt_tokens
    ]
    assert truncated  # the small window forces truncations


def test_rescale_counts() -> None:
    assert rescale_counts([10, 20, 30], 120) == [20, 40, 60]
    assert rescale_counts([5, 5, 5], 7) == [3, 2, 2]  # equal fractions: lower index first
    assert rescale_counts([1, 1, 100], 3) == [1, 1, 1]  # raised to 1, then taken from the largest
    assert rescale_counts([1, 1, 1, 1, 30], 10) == [1, 1, 1, 1, 6]
    assert rescale_counts([1, 9], 5) == [1, 4]  # 0.5 -> raised to 1; 4.5 -> 4
    with pytest.raises(ValueError):
        rescale_counts([1, 2, 3], 2)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="context window"):
        generate_sessions(PAPER_WORKLOAD, {"glm-4.5-fp8": 1000}, {}, 0)
    with pytest.raises(ValueError, match="total_calls"):
        WorkloadSpec(sessions=3, models=("a",), total_calls=2)
    with pytest.raises(ValueError, match="models"):
        WorkloadSpec(sessions=3, models=())
    with pytest.raises(ValueError, match=">= 2"):
        generate_sessions(WorkloadSpec(sessions=1, models=("a",)), {"a": 1}, {}, 0)


@settings(max_examples=60, deadline=None)
@given(
    sessions=st.integers(1, 6),
    n_models=st.integers(1, 3),
    window=st.integers(2, 40_000),
    extra_calls=st.none() | st.integers(0, 80),
    thinks=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_invariants(
    sessions: int, n_models: int, window: int, extra_calls: int | None, thinks: bool, seed: int
) -> None:
    models = tuple(f"m{j}" for j in range(n_models))
    total = None if extra_calls is None else sessions + extra_calls
    spec = WorkloadSpec(sessions=sessions, models=models, total_calls=total, calls_median=6)
    windows = {m: window + 1000 * j for j, m in enumerate(models)}
    out = generate_sessions(spec, windows, {m: thinks for m in models}, seed)
    assert len(out) == sessions
    for s in out:
        assert s.num_calls >= 1
        assert [c.call_index for c in s.calls] == list(range(s.num_calls))
        assert s.calls[-1].tool_gap_s is None
        assert all(c.tool_gap_s is not None and c.tool_gap_s >= 0 for c in s.calls[:-1])
        for c in s.calls:
            assert c.model == s.model
            assert 1 <= c.prompt_tokens <= windows[s.model] - c.output_tokens
            assert 0 <= c.new_tokens <= c.prompt_tokens
            assert c.output_tokens >= 1
    if total is not None:
        assert sum(s.num_calls for s in out) == total


def test_statistics_of_the_draws() -> None:
    rng = random.Random(1234)
    spec = PAPER_WORKLOAD
    outputs = [draw_output_tokens(rng, spec, False) for _ in range(N)]
    gaps = [draw_tool_gap(rng, spec) for _ in range(N)]
    calls = [draw_num_calls(rng, spec) for _ in range(N)]
    models = [draw_model_index(rng, spec) for _ in range(N)]
    assert statistics.median(outputs) == pytest.approx(150, rel=0.1)
    assert min(outputs) >= 1
    assert 0.3 <= statistics.median(gaps) <= 0.55
    assert 0.025 <= sum(g > 10 for g in gaps) / N <= 0.06
    assert (
        2.5 <= statistics.mean(gaps) <= 4.0
    )  # docs/sources.md §2: mean ~3.2 s (mean ~3.4-4.6 s observed)
    assert statistics.median(calls) == pytest.approx(28, rel=0.1)
    assert min(calls) >= 1 and max(calls) <= 250
    shares = [models.count(j) / N for j in range(3)]
    assert shares[0] > shares[1] > shares[2]
    for share, weight in zip(shares, (1, 1 / 2, 1 / 3), strict=True):
        assert share == pytest.approx(weight / (1 + 1 / 2 + 1 / 3), abs=0.02)


def test_generated_prompt_growth() -> None:
    spec = WorkloadSpec(sessions=400, models=("a",), mean_interarrival_s=0.0)
    sessions = generate_sessions(spec, {"a": 10**9}, {}, 7)
    c0 = [s.calls[0].prompt_tokens for s in sessions]
    assert statistics.median(c0) == pytest.approx(6000, rel=0.1)
    appended = [c.new_tokens for s in sessions for c in s.calls[1:]]
    assert statistics.median(appended) == pytest.approx(550, rel=0.1)


# -- demand that shifts over a day -------------------------------------------------------------

SIX = tuple(f"m{j}" for j in range(6))
SHIFTING = WorkloadSpec(
    sessions=6000, models=SIX, mean_interarrival_s=1.0, day_s=2000.0, diurnal_amplitude=0.9
)


def _share_in(sessions: list, model: str, start: float, end: float) -> float:
    inside = [s for s in sessions if start <= s.start_s < end]
    return sum(s.model == model for s in inside) / len(inside)


def test_without_a_day_the_draws_are_the_constant_zipf_ones() -> None:
    windows = {m: 131_072 for m in SIX}
    flat = WorkloadSpec(sessions=300, models=SIX)
    shifted = replace(flat, diurnal_amplitude=0.9, bursts_per_day=5.0)  # no day: no effect
    assert generate_sessions(flat, windows, {}, 4) == generate_sessions(shifted, windows, {}, 4)


def test_each_model_peaks_at_its_own_phase() -> None:
    """Model j's share is highest around t = day · (1/4 − j/n) mod day (its sine's crest) and
    lowest half a day later; the arrivals' timing is unchanged (same Poisson draws)."""
    windows = {m: 131_072 for m in SIX}
    sessions = generate_sessions(SHIFTING, windows, {}, 7)
    flat = generate_sessions(replace(SHIFTING, day_s=0.0), windows, {}, 7)
    assert [s.start_s for s in sessions] == [s.start_s for s in flat]
    day = SHIFTING.day_s
    for j in (0, 2, 4):
        crest = (day * (0.25 - j / len(SIX))) % day
        trough = (crest + day / 2) % day
        high = statistics.mean(
            _share_in(sessions, SIX[j], k * day + crest - 150, k * day + crest + 150)
            for k in range(3)
        )
        low = statistics.mean(
            _share_in(sessions, SIX[j], k * day + trough - 150, k * day + trough + 150)
            for k in range(3)
        )
        assert high > 3 * low, (j, high, low)


def test_a_burst_multiplies_its_models_demand_inside_it_only() -> None:
    spec = replace(
        SHIFTING, diurnal_amplitude=0.0, bursts_per_day=3.0, burst_s=400.0, burst_factor=8.0
    )
    bursts = draw_bursts(spec, 11)
    assert len(bursts) == round(3.0 * spec.sessions * spec.mean_interarrival_s / spec.day_s)
    burst = bursts[0]
    weights = demand_weights(spec, burst.start_s, [burst])
    base = demand_weights(spec, burst.end_s, [burst])  # the end is outside
    assert weights[burst.model] == pytest.approx(8.0 * base[burst.model])
    assert [w for j, w in enumerate(weights) if j != burst.model] == [
        w for j, w in enumerate(base) if j != burst.model
    ]
    assert draw_bursts(spec, 11) == bursts and draw_bursts(spec, 12) != bursts
