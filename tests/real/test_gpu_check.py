"""The prepared GPU check (bench/gpu/run.py) runs on this CPU through the same path it takes on a
GPU, minus what needs CUDA: it must measure the real model's steps through a real runtime and
``talaria calibrate``, write a profile the catalog and a replay read, and say what it skipped
and why instead of writing figures it did not measure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness.processes import talaria_command
from talaria.core.catalog import load_catalog

pytestmark = pytest.mark.vllm
"""It fits CPU timings but asserts only what load beside it cannot turn: the trained 135M
model's per-token cost above the 0.4M-parameter random one's, which may fit to 0 s when another
test's engine shares the cores (seen once); so it runs in the vLLM stage with the others, not
alone (``cpu_timing``)."""

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_check_runs_its_cpu_path(real_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "gpu"
    command = [sys.executable, str(ROOT / "bench" / "gpu" / "run.py"), "--device", "cpu",
               "--quick", "--model", str(real_dir), "--out", str(out)]  # fmt: skip
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert report["environment"]["device"] == "cpu"
    assert report["skipped"] == {"copy": "no CUDA device", "sleep_wake": "no CUDA device"}
    assert not (out / "server.toml").exists()  # nothing measured, nothing written
    fits = report["steps"]["fits"]
    assert set(fits) == {"smollm2", "tiny-a"}
    # the trained 135M model's step costs more than the 0.4M-parameter random one's
    assert fits["smollm2"]["s_per_token"] > fits["tiny-a"]["s_per_token"] >= 0
    assert report["steps"]["coresident_interference"] is not None
    assert report["models"]["smollm2"]["parameters"] == 134_515_008
    profile = load_catalog([out / "profile.toml"]).profiles["h200-measured"]
    assert set(profile.fitted) == {"smollm2", "tiny-a"}
    replay = subprocess.run(
        [*talaria_command(), "replay", "--preset", "small", "--policies",
         "talaria", "--profile", str(out / "profile.toml"), "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr[-2000:]
