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

pytestmark = [pytest.mark.vllm, pytest.mark.cpu_timing]
"""It fits CPU timings: scripts/test.sh runs it with nothing beside it (another test's vLLM
engine on the other core skewed the fit: 0.49 per-call error against 0.40 twice, and a 0 s
per-token fit of the tiny model, in a run where both passed alone)."""

ROOT = Path(__file__).resolve().parents[2]
P50_SCT_BOUND = 0.30
"""The issue's CI bound on the p50 SCT error (the full run's target is 10%)."""
CALL_LATENCY_BOUND = 0.40
"""Median per-call latency error (the full run's target is 15%; a 4-session run with the quick
calibration is noisier, and a broken fit or exporter lands far outside this)."""


ATTEMPTS = 2
"""The quick calibration measures each grid point once (13 samples per model), so one CPU
hiccup on a shared 2-core box can inflate its fitted step overhead two- to threefold and every
prediction with it (seen: 1 run in 3 with a per-call error over the bound, fitted overhead
4.5–5.8 ms against 1.4–2.5 ms in the others). A run outside the bounds is run once more, with
a new calibration; a broken fit or exporter fails both."""


def _run_once(out: Path) -> dict[str, float]:
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
    figures: dict[str, float] = doc["figures"]
    assert (figures["sessions"], figures["calls"]) == (4, 24)
    print(proc.stdout)  # the comparison table, in the CI log with -s / on failure
    assert (out / "fidelity.png").stat().st_size > 10_000
    trace = (out / "live.jsonl").read_text().splitlines()
    assert len(trace) == 24 and all('"latency_s"' in line for line in trace)
    return figures


def _within_bounds(figures: dict[str, float]) -> bool:
    return (
        figures["p50_sct_rel_error"] < P50_SCT_BOUND
        and figures["call_latency_median_rel_error"] < CALL_LATENCY_BOUND
    )


def test_a_replay_predicts_a_small_live_run(tmp_path: Path) -> None:
    tries = [_run_once(tmp_path / "fidelity-0")]
    while not _within_bounds(tries[-1]) and len(tries) < ATTEMPTS:
        tries.append(_run_once(tmp_path / f"fidelity-{len(tries)}"))
    figures = tries[-1]
    assert figures["p50_sct_rel_error"] < P50_SCT_BOUND, tries
    assert figures["call_latency_median_rel_error"] < CALL_LATENCY_BOUND, tries
