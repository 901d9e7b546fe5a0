"""bench/session_memory.py runs, and what it reports holds together: every session live, each
with its two index entries, and every continuation found (the bench asserts it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import REPO_ROOT


def test_the_session_memory_bench_runs_small(tmp_path: Path) -> None:
    out = tmp_path / "sm.json"
    command = [sys.executable, str(REPO_ROOT / "bench" / "session_memory.py"), "--sessions", "400",
               "--lookups", "100", "--json", str(out)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    doc = json.loads(out.read_text())
    assert doc["live_sessions"] == 400
    assert doc["index_entries_per_session"] == 2.0
    assert doc["traced_bytes_per_session"] > 0
    assert set(doc["lookup_us"]) == {"implicit", "explicit"}
