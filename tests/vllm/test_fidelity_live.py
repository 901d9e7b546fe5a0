"""The fidelity check, small enough for CI: bench/fidelity/run.py end to end (a real runtime
with two vLLM CPU engines, ``talaria calibrate``, the proxy driven by the real ``openai``
client, ``talaria trace export``, a replay) must predict the live run within loose bounds, so a
regression in the engine path or in the simulator shows. The full run and its figures:
docs/fidelity.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
P50_SCT_BOUND = 0.30
"""The issue's CI bound on the p50 SCT error (the full run's target is 10%)."""
CALL_LATENCY_BOUND = 0.40
"""Median per-call latency error (the full run's target is 15%; a 4-session run with the quick
calibration is noisier, and a broken fit or exporter lands far outside this)."""


def test_a_replay_predicts_a_small_live_run(tmp_path: Path) -> None:
    out = tmp_path / "fidelity"
    args = ["--sessions", "4", "--calls", "6", "--quick-calibration", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fidelity" / "run.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads((out / "fidelity.json").read_text())
    figures = doc["figures"]
    assert (figures["sessions"], figures["calls"]) == (4, 24)
    print(proc.stdout)  # the comparison table, in the CI log with -s / on failure
    assert figures["p50_sct_rel_error"] < P50_SCT_BOUND, figures
    assert figures["call_latency_median_rel_error"] < CALL_LATENCY_BOUND, figures
    assert (out / "fidelity.png").stat().st_size > 10_000
    trace = (out / "live.jsonl").read_text().splitlines()
    assert len(trace) == 24 and all('"latency_s"' in line for line in trace)
