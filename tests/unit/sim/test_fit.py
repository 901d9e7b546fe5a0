"""The step-time fit (sim/fit.py) and the fitted cost model it feeds."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from talaria.core.catalog import load_catalog
from talaria.core.efficiency_profile import EfficiencyProfile, StepFit
from talaria.runtime.costmodel import CostModel, PrefillChunk
from talaria.sim.calibrate import ModelCalibration
from talaria.sim.fit import COEFFICIENTS, FitReport, StepSample, fit_steps, profile_toml

TRUE = StepFit(
    overhead_s=3e-3,
    s_per_token=1e-5,
    s_per_pair=3e-9,
    s_per_seq=8e-5,
    call_overhead_s=2.5e-3,
    mixed_step_s=4e-3,
)


def _grid(fit: StepFit, noise: float = 0.0, seed: int = 0, mixed: bool = True) -> list[StepSample]:
    """Prefill, decode and (with ``mixed``) mixed samples like talaria calibrate's, timed by
    ``fit`` (× lognormal-ish noise of relative size ``noise``)."""
    rng = random.Random(seed)
    samples = []
    for prompt in (32, 128, 512, 1024, 1536):
        for cached in (0, prompt // 2):
            n = prompt - cached
            pairs = n * cached + n * n / 2
            t = fit.step_time_s(n, pairs, 1) + fit.call_overhead_s
            samples.append(StepSample("prefill", n, pairs, 1, t * (1 + noise * rng.gauss()), 1))
    for batch in (1, 2, 4, 8, 16):
        for context in (64, 512, 1024):
            pairs = float(batch * context)
            t = fit.step_time_s(batch, pairs, batch)
            samples.append(StepSample("decode", batch, pairs, batch, t * (1 + noise * rng.gauss())))
    for batch in (1, 4, 8) if mixed else ():
        for prompt in (64, 256):
            n, pairs, seqs = batch + prompt, batch * 512 + prompt * prompt / 2, batch + 1
            t = fit.step_time_s(n, pairs, seqs, mixed=True) * (1 + noise * rng.gauss())
            samples.append(StepSample("mixed", n, pairs, seqs, t, mixed=1))
    return samples


def test_exact_samples_give_back_the_coefficients() -> None:
    report = fit_steps(_grid(TRUE))
    for name in COEFFICIENTS:
        assert getattr(report.fit, name) == pytest.approx(getattr(TRUE, name), rel=1e-6)
    assert report.max_abs_rel_residual < 1e-9
    assert report.samples == 31


def test_without_mixed_samples_a_mixed_step_costs_nothing_extra() -> None:
    report = fit_steps(_grid(replace(TRUE, mixed_step_s=0.0), mixed=False))
    assert report.fit.mixed_step_s == 0.0
    assert report.fit.overhead_s == pytest.approx(TRUE.overhead_s, rel=1e-6)


def test_noisy_samples_land_near_the_coefficients() -> None:
    report = fit_steps(_grid(TRUE, noise=0.05, seed=3))
    assert report.fit.overhead_s == pytest.approx(TRUE.overhead_s, rel=0.15)
    assert report.fit.s_per_token == pytest.approx(TRUE.s_per_token, rel=0.25)
    assert 0.02 < report.median_abs_rel_residual < 0.08


def test_a_coefficient_the_data_pushes_below_zero_is_pinned_at_zero() -> None:
    no_pairs = StepFit(4e-3, 2e-5, 0.0, 1e-4, 3e-3)
    samples = [
        StepSample(
            s.kind, s.tokens, s.pairs, s.seqs, s.seconds * (1 - 1e-7 * s.pairs), s.intake, s.mixed
        )
        for s in _grid(no_pairs)
    ]  # time falling slightly with pairs: unconstrained least squares would go negative
    report = fit_steps(samples)
    assert report.fit.s_per_pair == 0.0
    assert all(getattr(report.fit, c) >= 0 for c in COEFFICIENTS)


@pytest.mark.parametrize(
    ("samples", "message"),
    [
        ([StepSample("decode", 1, 1.0, 1, 0.01)] * 5, "at least 6"),
        ([StepSample("decode", 1, 1.0, 1, 0.0)] * 6, "positive"),
    ],
)
def test_unfittable_input_is_refused(samples: list[StepSample], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit_steps(samples)


def test_the_written_profile_loads_back_as_the_fit(tmp_path: Path) -> None:
    report = fit_steps(_grid(TRUE))
    path = tmp_path / "calibrated.toml"
    text = profile_toml(
        "calib", {"tiny-a": report}, max_num_batched_tokens=2048, block_tokens=128, source="t"
    )
    path.write_text(text)
    profile = load_catalog([path]).profile("calib")
    assert profile.max_num_batched_tokens == 2048 and profile.block_tokens == 128
    loaded = profile.fitted["tiny-a"]
    for name in COEFFICIENTS:
        assert getattr(loaded, name) == pytest.approx(getattr(report.fit, name), rel=1e-6)


def test_a_fitted_model_times_steps_by_its_fit_and_others_by_the_roofline() -> None:
    catalog = load_catalog()
    server = catalog.server("cpu-vllm")
    profile = EfficiencyProfile(name="p", block_tokens=128, fitted={"tiny-a": TRUE})
    fitted = CostModel(catalog.model("tiny-a"), server, profile)
    roofline = CostModel(catalog.model("tiny-b"), server, profile)
    chunk = PrefillChunk(tokens=300, context_tokens=200)
    pairs = 300 * 200 + 300 * 300 / 2 + 1000  # the chunk + one decoding sequence at 1000
    assert fitted.step_time_s([chunk], 1000, 1) == pytest.approx(
        TRUE.overhead_s + TRUE.s_per_token * 301 + TRUE.s_per_pair * pairs + TRUE.s_per_seq * 2
        + TRUE.mixed_step_s  # a chunk beside a decoding sequence: a mixed step
    )  # fmt: skip
    alone = 300 * 200 + 300 * 300 / 2
    assert fitted.step_time_s([chunk], 0, 0) == pytest.approx(
        TRUE.overhead_s + TRUE.s_per_token * 300 + TRUE.s_per_pair * alone + TRUE.s_per_seq
    )  # a prefill alone is not mixed
    assert fitted.decode_step_time_s(4, 4000) == pytest.approx(TRUE.step_time_s(4, 4000, 4))
    assert fitted.call_overhead_s() == TRUE.call_overhead_s
    assert roofline.fit is None and roofline.call_overhead_s() == 0.0
    plain = CostModel(catalog.model("tiny-b"), server, EfficiencyProfile(block_tokens=128))
    assert roofline.step_time_s([chunk], 1000, 1) == plain.step_time_s([chunk], 1000, 1)


def test_a_malformed_fit_table_is_a_catalog_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[profile]\nname = "bad"\n[profile.fitted.tiny-a]\noverhead_s = 1.0\n')
    with pytest.raises(ValueError, match=r"fitted\.tiny-a"):
        load_catalog([path])


@pytest.mark.parametrize(
    ("idle_s", "extra_s"),
    [(0.0, 0.0), (0.05, 0.004), (0.1, 0.008), (0.55, 0.014), (1.0, 0.02), (30.0, 0.02),
     (-1.0, 0.0)],
)  # fmt: skip
def test_idle_wake_interpolates_between_points_and_holds_past_the_ends(
    idle_s: float, extra_s: float
) -> None:
    fit = replace(TRUE, idle_wake=((0.0, 0.0), (0.1, 0.008), (1.0, 0.02)))
    assert fit.wake_s(idle_s) == pytest.approx(extra_s)
    assert replace(TRUE, idle_wake=()).wake_s(idle_s) == 0.0


def test_idle_wake_points_must_come_in_order_of_idle_time(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must increase"):
        replace(TRUE, idle_wake=((0.1, 0.0), (0.1, 0.01)))
    path = tmp_path / "p.toml"
    text = profile_toml("w", {"tiny-a": fit_steps(_grid(TRUE))}, max_num_batched_tokens=2048,
                        block_tokens=128, source="t")  # fmt: skip
    path.write_text(text + "idle_wake = [[1.0, 0.01], [0.5, 0.02]]\n")
    with pytest.raises(ValueError, match="must increase"):
        load_catalog([path])


def test_the_written_idle_ladder_loads_back(tmp_path: Path) -> None:
    report = fit_steps(_grid(TRUE))
    ladder = ((0.0, 0.0), (0.1, 0.0075), (1.0, 0.025))
    report = FitReport(replace(report.fit, idle_wake=ladder), report.samples,
                       report.rel_residuals)  # fmt: skip
    path = tmp_path / "p.toml"
    path.write_text(profile_toml("w", {"tiny-a": report}, max_num_batched_tokens=2048,
                                 block_tokens=128, source="t"))  # fmt: skip
    loaded = load_catalog([path]).profile("w").fitted["tiny-a"].idle_wake
    assert [x for p in loaded for x in p] == pytest.approx([x for p in ladder for x in p])


def test_the_measured_ladder_is_relative_floored_and_non_decreasing() -> None:
    cal = ModelCalibration("tiny-a")
    cal.idle_ttft_s = {0.0: [0.006, 0.005, 0.007], 0.1: [0.004, 0.005], 0.3: [0.012, 0.013],
                       1.0: [0.010, 0.011]}  # fmt: skip
    flat = [x for point in cal.idle_wake() for x in point]
    assert flat == pytest.approx([0.0, 0.0, 0.1, 0.0, 0.3, 0.0065, 1.0, 0.0065])
    assert ModelCalibration("x").idle_wake() == ()


def test_replay_uses_a_calibrated_profile_file_and_a_named_server(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from talaria.cli import app
    from talaria.core.trace import write_trace
    from talaria.sim.fidelity import FidelityWorkload, fidelity_workload

    profile = tmp_path / "cpu.toml"
    fits = {"tiny-a": fit_steps(_grid(TRUE)), "tiny-b": fit_steps(_grid(TRUE))}
    text = profile_toml(
        "cpu-cal", fits, max_num_batched_tokens=2048, block_tokens=128, source="t", hop_s=0.004
    )
    profile.write_text(text)
    trace = tmp_path / "t.jsonl"
    write_trace(trace, fidelity_workload(FidelityWorkload(sessions=2, calls=3), 0))
    out = tmp_path / "r.json"
    args = [
        "replay",
        "--trace",
        str(trace),
        "--server",
        "cpu-vllm",
        "--profile",
        str(profile),
        "--policies",
        "talaria",
        "--quantum-s",
        "2",
        "--json",
        str(out),
        "--no-progress",
    ]
    result = CliRunner().invoke(app, args)  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["setup"]["server"] == "cpu-vllm" and doc["setup"]["profile"] == "cpu-cal"
    assert doc["policies"]["talaria"]["calls_completed"] == 6
    bad = CliRunner().invoke(app, [*args[:5], "--profile", "nope"])
    assert bad.exit_code == 2 and "unknown efficiency profile" in bad.output
