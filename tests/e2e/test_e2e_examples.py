"""End to end: ``talaria serve`` as a real subprocess, each example run as a subprocess
against it, and the admin API checked: one session per agent, tool gaps recorded, the session
ended when the agent left its scope.

The server listens on ``--port 0``; readiness is read from its stderr (tests/e2e/processes.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.harness.processes import talaria_serve
from tests.support import admin_get

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ADMIN = "e2e-admin-secret-token"
RUN_S = 120.0


@dataclass
class Served:
    base_url: str

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def admin(self, path: str) -> dict[str, Any]:
        data: dict[str, Any] = admin_get(self.base_url, ADMIN, path)
        return data


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    data_dir = tmp_path_factory.mktemp("talaria-data")
    env = {"TALARIA_ADMIN_TOKEN": ADMIN}
    with talaria_serve(["--time-scale", "50"], env, data_dir) as process:
        yield Served(process.base_url)


def _run_example(name: str, served: Served, *args: str) -> dict[str, Any]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--base-url", served.v1, "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    summary["stdout"] = done.stdout
    return summary


def _check_agent_session(served: Served, summary: dict[str, Any]) -> None:
    sid = summary["session_id"]
    assert f"session {sid}" in summary["stdout"] and "SCT" in summary["stdout"]
    assert summary["steps"] == ["write_file", "ls", "cat", "run_python"]
    detail = served.admin(f"/admin/sessions/{sid}")
    session = detail["session"]
    assert session["state"] == "ended" and session["end_reason"] == "client"
    calls = detail["calls"]
    assert len(calls) == summary["calls"] == 5
    assert [c["finish_reason"] for c in calls[:4]] == ["tool_calls"] * 4
    assert calls[4]["finish_reason"] in ("stop", "length")  # the answer, capped by max_tokens
    assert all(c["tool_gap_hint_s"] is not None for c in calls[:4])
    assert calls[0]["tool_gap_hint_s"] == 3.0 and calls[4]["tool_gap_hint_s"] is None
    assert [g["after_call"] for g in detail["tool_gaps"]] == [0, 1, 2, 3]
    assert all(g["gap_s"] >= 0 for g in detail["tool_gaps"])
    assert any(c["cached_tokens"] > 0 for c in calls[1:])
    kinds = [(h["kind"], h["tool"]) for h in detail["hints"]]
    assert kinds == [("tool_gap", "run_python"), ("end", None)]
    assert detail["reservations"]


def test_swe_agent(served: Served) -> None:
    _check_agent_session(served, _run_example("swe_agent.py", served))


def test_litellm_agent(served: Served) -> None:
    _check_agent_session(served, _run_example("litellm_agent.py", served))


def test_concurrent_agents(served: Served) -> None:
    summary = _run_example("concurrent_agents.py", served, "--sessions", "20", "--steps", "3")
    sessions = summary["sessions"]
    assert len(sessions) == 20 and len({s["session_id"] for s in sessions}) == 20
    assert "p50" in summary["stdout"] and "p95" in summary["stdout"]
    assert 0 < summary["p50_s"] <= summary["p95_s"]
    for s in sessions:
        detail = served.admin(f"/admin/sessions/{s['session_id']}")
        assert detail["session"]["state"] == "ended"
        assert len(detail["calls"]) == s["calls"] == 4
        assert [g["after_call"] for g in detail["tool_gaps"]] == [0, 1, 2]
        assert all(c["tool_gap_hint_s"] is not None for c in detail["calls"][:3])
