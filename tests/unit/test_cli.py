"""The ``talaria`` command, through typer's runner (same process, real files)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from talaria.cli import app

runner = CliRunner()


def test_help_explains_the_commands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("replay", "trace", "catalog"):
        assert command in result.output
    replay_help = runner.invoke(app, ["replay", "--help"])
    assert replay_help.exit_code == 0
    assert "--sweep" in replay_help.output and "oracle" in replay_help.output


def test_replay_small_preset_writes_json_and_png(tmp_path: Path) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    result = runner.invoke(
        app,
        [
            "replay",
            "--preset",
            "small",
            "--policies",
            "round,talaria",
            "--no-progress",
            "--json",
            str(out),
            "--plot",
            str(png),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert set(doc["policies"]) == {"round", "talaria"}
    for summary in (*doc["policies"].values(), doc["dedicated"]):
        for key in (
            "p50_sct_s",
            "p95_sct_s",
            "mean_sct_s",
            "speedup_p50",
            "speedup_p95",
            "calls_completed",
        ):
            assert key in summary
        assert summary["calls_completed"] == doc["calls"] == 48
    assert doc["oracle"]["p50_sct_s"] <= doc["policies"]["talaria"]["p50_sct_s"]
    assert doc["policies"]["round"]["speedup_p50"] == 1.0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "talaria" in result.output and "oracle" in result.output


def test_replay_of_a_generated_trace_matches_the_generated_run(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    gen = runner.invoke(
        app, ["trace", "generate", "--preset", "small", "--seed", "3", "--out", str(trace)]
    )
    assert gen.exit_code == 0, gen.output
    from_trace, generated = tmp_path / "a.json", tmp_path / "b.json"
    common = ["replay", "--policies", "talaria", "--no-progress"]
    assert (
        runner.invoke(app, [*common, "--trace", str(trace), "--json", str(from_trace)]).exit_code
        == 0
    )
    assert (
        runner.invoke(
            app, [*common, "--preset", "small", "--seed", "3", "--json", str(generated)]
        ).exit_code
        == 0
    )
    a, b = json.loads(from_trace.read_text()), json.loads(generated.read_text())
    assert a["policies"] == b["policies"]


def test_sweep_adds_rows(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    result = runner.invoke(
        app,
        [
            "replay",
            "--preset",
            "small",
            "--policies",
            "round,talaria",
            "--no-progress",
            "--sweep",
            "quantum_s=30,90",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["sweep"]
    assert [(r["param"], r["value"]) for r in rows] == [("quantum_s", 30.0), ("quantum_s", 90.0)]


def test_bad_inputs_give_clear_errors(tmp_path: Path) -> None:
    bad_policy = runner.invoke(app, ["replay", "--policies", "round,fastest", "--no-progress"])
    assert bad_policy.exit_code == 2
    assert "unknown policy 'fastest'" in bad_policy.output
    bad_sweep = runner.invoke(app, ["replay", "--sweep", "speed=1", "--no-progress"])
    assert bad_sweep.exit_code == 2 and "NAME=V1,V2" in bad_sweep.output
    bad_trace = tmp_path / "bad.jsonl"
    bad_trace.write_text('{"session_id": "s"}\n')
    result = runner.invoke(app, ["replay", "--trace", str(bad_trace), "--no-progress"])
    assert result.exit_code == 2 and "bad.jsonl:1" in result.output
    missing = runner.invoke(app, ["replay", "--trace", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2


def test_catalog_lists_shipped_models() -> None:
    result = runner.invoke(app, ["catalog"])
    assert result.exit_code == 0
    assert "glm-4.5-fp8" in result.output and "h200x8" in result.output
