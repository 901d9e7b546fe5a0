"""Fidelity comparison (sim/fidelity.py): the workload it drives and the errors it reports."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from talaria.core.catalog import load_catalog
from talaria.core.efficiency_profile import EfficiencyProfile, StepFit
from talaria.core.trace import SessionTrace
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import policy_flags
from talaria.runtime.sim_node import NodeSetup
from talaria.sim.fidelity import (
    FidelityWorkload,
    compare,
    fidelity_workload,
    measured_sct_s,
    repeatability,
)
from talaria.sim.plots import plot_fidelity
from talaria.sim.replay import ReplayOutcome, replay

FIT = StepFit(3e-3, 1e-5, 3e-9, 8e-5, 2.5e-3)
SPEC = FidelityWorkload(sessions=4, calls=5)


def _replay(sessions: list[SessionTrace]) -> ReplayOutcome:
    catalog = load_catalog()
    catalog.profiles["cal"] = EfficiencyProfile(
        name="cal", max_num_batched_tokens=2048, block_tokens=128,
        fitted={"tiny-a": FIT, "tiny-b": FIT},
    )  # fmt: skip
    layout = [("node0", NodeSetup("cpu-vllm", "cal", ("tiny-a", "tiny-b")))]
    return replay(sessions, catalog, layout, policy_flags("talaria"), SchedulerConfig(2.0))


def _as_measured(
    sessions: list[SessionTrace], outcome: ReplayOutcome, scale: float
) -> list[SessionTrace]:
    """The trace a live run would export if it had timed every call as ``outcome`` × scale."""
    by_id = {s.session_id: s for s in outcome.sessions}
    out = []
    for session in sessions:
        run = by_id[session.session_id]
        calls = tuple(
            replace(
                call,
                arrival_offset_s=r.arrival_s,
                latency_s=r.latency_s * scale,
                ttft_s=(r.first_token_s - r.arrival_s) * scale,
            )
            for call, r in zip(session.calls, run.calls, strict=True)
        )
        out.append(replace(session, calls=calls))
    return out


def test_the_workload_is_seeded_append_only_and_fits_the_tiny_models() -> None:
    a, b = fidelity_workload(SPEC, 7), fidelity_workload(SPEC, 7)
    assert a == b and a != fidelity_workload(SPEC, 8)
    assert [s.model for s in a] == ["tiny-a", "tiny-b", "tiny-a", "tiny-b"]
    for session in a:
        assert [c.call_index for c in session.calls] == list(range(5))
        assert session.calls[0].new_tokens == session.calls[0].prompt_tokens
        assert session.calls[-1].tool_gap_s is None
        for prev, call in zip(session.calls, session.calls[1:], strict=False):
            assert call.prompt_tokens == prev.prompt_tokens + prev.output_tokens + call.new_tokens
        last = session.calls[-1]
        assert last.prompt_tokens + last.output_tokens <= SPEC.max_context_tokens <= 2048


def test_a_replay_compared_with_itself_has_no_error() -> None:
    sessions = fidelity_workload(SPEC, 0)
    outcome = _replay(sessions)
    doc = compare(_as_measured(sessions, outcome, 1.0), outcome)
    f = doc["figures"]
    assert f["sessions"] == 4 and f["calls"] == 20
    for key in ("call_latency_median_rel_error", "ttft_median_rel_error", "sct_median_rel_error",
                "p50_sct_rel_error", "p95_sct_rel_error"):  # fmt: skip
        assert f[key] == pytest.approx(0.0, abs=1e-9), key
    assert 0 < f["tool_time_fraction"] < 1


def test_measurements_ten_percent_slower_show_as_a_nine_percent_error() -> None:
    sessions = fidelity_workload(SPEC, 0)
    outcome = _replay(sessions)
    doc = compare(_as_measured(sessions, outcome, 1.1), outcome)
    f = doc["figures"]
    assert f["call_latency_median_rel_error"] == pytest.approx(1 - 1 / 1.1)
    assert f["call_latency_median_signed_rel_error"] == pytest.approx(1 / 1.1 - 1)
    assert f["ttft_p95_rel_error"] == pytest.approx(1 - 1 / 1.1)
    # the SCT also holds the (unchanged) tool gaps, so its error is smaller
    assert 0 < f["p50_sct_rel_error"] < 1 - 1 / 1.1


def test_measured_sct_runs_from_the_first_send_to_the_last_answer() -> None:
    session = fidelity_workload(SPEC, 0)[1]
    calls = list(session.calls)
    calls[0] = replace(calls[0], arrival_offset_s=10.0)
    calls[-1] = replace(calls[-1], arrival_offset_s=25.0, latency_s=1.5)
    assert measured_sct_s(replace(session, calls=tuple(calls))) == pytest.approx(16.5)
    with pytest.raises(ValueError, match="no measured latency"):
        measured_sct_s(session)


def _renamed(sessions: list[SessionTrace], tag: str) -> list[SessionTrace]:
    """The same sessions under other ids, as another run's store keys them."""
    return [
        replace(
            s,
            session_id=f"{tag}{i}",
            calls=tuple(replace(c, session_id=f"{tag}{i}") for c in s.calls),
        )
        for i, s in enumerate(sessions)
    ]


def test_identical_live_runs_predict_each_other_exactly() -> None:
    sessions = fidelity_workload(SPEC, 0)
    measured = _as_measured(sessions, _replay(sessions), 1.0)
    runs = [measured, _renamed(measured[::-1], "x"), _renamed(measured, "y")]
    for f in repeatability(runs):
        assert f["calls"] == 20 and f["sessions"] == 4
        assert f["call_latency_median_rel_error"] == pytest.approx(0.0, abs=1e-12)
        assert f["ttft_median_rel_error"] == pytest.approx(0.0, abs=1e-12)
        assert f["p50_sct_rel_error"] == pytest.approx(0.0, abs=1e-12)


def test_each_run_is_predicted_by_the_median_of_the_others() -> None:
    """Three runs at 0.9×, 1× and 1.2× one timing: the 1× run's peers' median is 1.05×; the
    slow run's is 0.95× (the median of 0.9 and 1.0), so it reads 1 − 0.95/1.2 off."""
    sessions = fidelity_workload(SPEC, 0)
    outcome = _replay(sessions)
    runs = [_as_measured(sessions, outcome, k) for k in (0.9, 1.0, 1.2)]
    low, mid, high = repeatability(runs)
    assert mid["call_latency_median_rel_error"] == pytest.approx(0.05)
    assert high["call_latency_median_signed_rel_error"] == pytest.approx(0.95 / 1.2 - 1)
    assert low["ttft_median_rel_error"] == pytest.approx(1.1 / 0.9 - 1)


def test_repeatability_refuses_runs_of_other_workloads() -> None:
    one = fidelity_workload(SPEC, 0)
    measured = _as_measured(one, _replay(one), 1.0)
    with pytest.raises(ValueError, match="at least two"):
        repeatability([measured])
    other = fidelity_workload(SPEC, 1)
    with pytest.raises(ValueError, match="not of one workload"):
        repeatability([measured, _as_measured(other, _replay(other), 1.0)])


def test_the_comparison_plots_as_a_png(tmp_path: Path) -> None:
    sessions = fidelity_workload(SPEC, 0)
    outcome = _replay(sessions)
    doc = compare(_as_measured(sessions, outcome, 1.1), outcome)
    path = plot_fidelity(doc, tmp_path / "f.png", title="test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
