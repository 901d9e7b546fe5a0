"""bench/call_path.py runs: both variants answer every call 200 (the bench raises otherwise)
and it prints a figure for each run and each variant's median."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support import REPO_ROOT


def test_the_call_path_bench_runs_small() -> None:
    command = [sys.executable, str(REPO_ROOT / "bench" / "call_path.py"), "--kb", "2,8",
               "--calls", "40", "--pairs", "1", "--concurrency", "4"]  # fmt: skip
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=300).stdout
    assert len(re.findall(r"pair 0  lanes (on |off)  \d+\.\d+ ms/call", out)) == 4
    assert len(re.findall(r"median: lanes on \d+\.\d+, off \d+\.\d+", out)) == 2
