"""Figures: the experiment plot and the sweep plot write PNGs of the expected size."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from matplotlib.image import imread

from talaria.core.catalog import load_catalog
from talaria.sim.experiment import ExperimentSetup, run_experiment
from talaria.sim.plots import plot_experiment, plot_sweep
from talaria.sim.workload import WorkloadSpec, generate_sessions

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MODELS = ("glm-4.5-fp8", "qwen3-235b-a22b-bf16", "qwen3-coder-480b-a35b-fp8")


def _slot(node: str, model: str, start: float, switch: float, end: float) -> dict[str, Any]:
    return {
        "node": node,
        "model": model,
        "start_s": start,
        "switch_s": switch,
        "end_s": end,
        "close": "idle",
        "admitted": 1,
        "sp_admitted": 0,
    }


def _policy(sct: dict[str, float], timeline: list[dict[str, Any]]) -> dict[str, Any]:
    values = sorted(sct.values())
    return {
        "sct_s": sct,
        "p50_sct_s": values[len(values) // 2],
        "p95_sct_s": values[-1],
        "timeline": timeline,
    }


def _hand_doc() -> dict[str, Any]:
    round_slots = [
        _slot("node0", "a", 0.0, 5.0, 20.0),
        _slot("node0", "b", 20.0, 8.0, 50.0),
        _slot("node1", "b", 0.0, 8.0, 30.0),
        _slot("node1", "a", 30.0, 5.0, 70.0),
    ]
    talaria_slots = [_slot("node0", "a", 0.0, 5.0, 25.0), _slot("node1", "b", 0.0, 8.0, 40.0)]
    return {
        "setup": {"models": ["a", "b"]},
        "policies": {
            "round": _policy({"s0": 20.0, "s1": 50.0, "s2": 70.0}, round_slots),
            "talaria": _policy({"s0": 12.0, "s1": 25.0, "s2": 40.0}, talaria_slots),
        },
        "oracle": {"sct_s": {"s0": 4.0, "s1": 8.0, "s2": 10.0}, "p50_sct_s": 8.0},
        "dedicated": _policy({"s0": 10.0, "s1": 20.0, "s2": 30.0}, talaria_slots),
    }


def _check_png(path: Path, width: int, height: int) -> None:
    assert path.exists()
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    pixels = imread(path)
    assert pixels.shape[:2] == (height, width)


def test_hand_built_document(tmp_path: Path) -> None:
    out = plot_experiment(_hand_doc(), tmp_path / "nested" / "dir" / "exp.png", title="hand")
    assert out == tmp_path / "nested" / "dir" / "exp.png"
    _check_png(out, 12 * 120, 9 * 120)


@pytest.mark.parametrize("missing", ["talaria", "round"])
def test_missing_timeline_policy_still_plots(tmp_path: Path, missing: str) -> None:
    doc = copy.deepcopy(_hand_doc())
    del doc["policies"][missing]
    _check_png(plot_experiment(doc, str(tmp_path / "exp.png")), 12 * 120, 9 * 120)


def test_wide_range_uses_log_axis(tmp_path: Path) -> None:
    doc = _hand_doc()
    doc["policies"]["round"]["sct_s"]["s2"] = 5000.0
    _check_png(plot_experiment(doc, tmp_path / "log.png"), 12 * 120, 9 * 120)


def test_real_tiny_run(tmp_path: Path) -> None:
    cat = load_catalog()
    spec = WorkloadSpec(sessions=4, models=MODELS, total_calls=16)
    windows = {m: cat.model(m).context_window_tokens for m in MODELS}
    sess = generate_sessions(spec, windows, {m: False for m in MODELS}, seed=1)
    setup = ExperimentSetup("h200x8", "default", MODELS)
    doc = run_experiment(sess, cat, setup, ["round", "talaria"])
    _check_png(plot_experiment(doc, tmp_path / "real.png"), 12 * 120, 9 * 120)


def test_sweep(tmp_path: Path) -> None:
    rows = [
        {
            "param": param,
            "value": value,
            "round_p50_sct_s": 100.0,
            "talaria_p50_sct_s": 100.0 / (2 + value),
            "round_p95_sct_s": 300.0,
            "talaria_p95_sct_s": 300.0 / (1 + value),
            "speedup_p50": 2 + value,
            "speedup_p95": 1 + value,
        }
        for param in ("quantum_s", "sessions", "nodes", "switch_scale")
        for value in (1.0, 2.0, 4.0)
    ]
    out = plot_sweep(rows, tmp_path / "sweep" / "sweep.png")
    # four parameters: a 3 × 2 grid of 4.5 × 3.6 inch panels at 120 dpi
    _check_png(out, int(3 * 4.5 * 120), int(2 * 3.6 * 120))
