"""The ``talaria`` command, through typer's runner (same process, real files)."""

from __future__ import annotations

import json
import re
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from talaria.cli import app
from talaria.core.http_edge import EdgeBounds
from tests.support import REPO_ROOT, flat

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


# -- review findings: input validation, one-line errors, help texts -------------------------------


def _last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


def _no_uvicorn(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Make the server record its start instead of serving; clear the proxy's env settings."""
    from talaria.proxy.edge import serve

    for name in ("ROUTER", "MODELS", "RUNTIMES", "CATALOG_PATH", "SERVER", "PROFILE"):
        monkeypatch.delenv(f"TALARIA_{name}", raising=False)
    started: list[dict[str, Any]] = []
    monkeypatch.setattr(serve, "serve", lambda app, **kw: started.append(kw))
    return started


def test_serve_refuses_an_unknown_router_before_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    from talaria.core.routing.routers import ROUTER_NAMES

    started = _no_uvicorn(monkeypatch)
    result = runner.invoke(app, ["serve", "--router", "nope"])
    assert result.exit_code == 2, result.output
    assert not started
    text = flat(result.output)
    assert "Invalid value for '--router': unknown router 'nope'; choose from:" in text
    assert f"choose from: {', '.join(ROUTER_NAMES)}" in text
    assert "Traceback" not in result.output
    help_text = flat(runner.invoke(app, ["serve", "--help"]).output)
    assert all(name in help_text for name in ROUTER_NAMES)


def test_serve_refuses_unknown_models_before_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    started = _no_uvicorn(monkeypatch)
    result = runner.invoke(app, ["serve", "--models", "bogus-model,tiny-a,other"])
    assert result.exit_code == 2, result.output
    assert not started
    text = flat(result.output)
    assert "Invalid value for '--models': unknown model(s) 'bogus-model', 'other'; known:" in text
    assert "glm-4.5-fp8" in text and "tiny-a" in text
    assert "Traceback" not in result.output
    empty = runner.invoke(app, ["serve", "--models", ""])
    assert empty.exit_code == 2 and "no models for the embedded node" in flat(empty.output)
    # Runtime servers bring their own models: --models is not checked against the catalog then.
    remote = runner.invoke(app, ["serve", "--runtime", "http://127.0.0.1:9", "--router", "sticky"])
    assert remote.exit_code == 0, remote.output
    assert len(started) == 1


def test_serve_finds_models_in_the_settings_catalog_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started = _no_uvicorn(monkeypatch)
    shipped = (REPO_ROOT / "core/data/models/tiny-a.toml").read_text()
    (tmp_path / "mine.toml").write_text(shipped.replace('name = "tiny-a"', 'name = "my-model"'))
    unknown = runner.invoke(app, ["serve", "--models", "my-model"])
    assert unknown.exit_code == 2 and "unknown model(s) 'my-model'" in flat(unknown.output)
    monkeypatch.setenv("TALARIA_CATALOG_PATH", str(tmp_path))
    result = runner.invoke(app, ["serve", "--models", "my-model,tiny-a", "--port", "8123"])
    assert result.exit_code == 0, result.output
    assert started == [
        {
            "host": "127.0.0.1",
            "port": 8123,
            "log_level": "info",
            "drain_timeout_s": 30.0,
            "bounds": EdgeBounds(header_timeout_s=10.0, max_connections=None),
        }
    ]


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["--sessions", "0"], "'--sessions'"),
        (["--sessions", "-3"], "'--sessions'"),
        (["--sweep", "sessions=4,0"], "'--sweep': sessions values must be whole numbers >= 1"),
        (["--sweep", "sessions=2.5"], "'--sweep': sessions values must be whole numbers >= 1"),
        (["--quantum-s", "-1"], "'--quantum-s': must be > 0, got -1"),
        (["--quantum-s", "0"], "'--quantum-s': must be > 0, got 0"),
        (["--quantum-s", "nan"], "'--quantum-s': must be > 0, got nan"),
        (["--sweep", "quantum_s=30,-1"], "'--sweep': quantum_s values must be > 0, got -1"),
        (["--nodes", "0"], "'--nodes'"),
        (["--sweep-seeds", "0"], "'--sweep-seeds'"),
    ],
)
def test_replay_rejects_non_positive_counts_and_quanta(args: list[str], hint: str) -> None:
    result = runner.invoke(app, ["replay", "--preset", "small", "--no-progress", *args])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for {hint}" in flat(result.output)
    assert "Traceback" not in result.output


def test_trace_generate_rejects_a_non_positive_session_count(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    result = runner.invoke(app, ["trace", "generate", "--sessions", "0", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--sessions'" in flat(result.output)
    assert not out.exists()


def _one_call_trace(path: Path, model: str, prompt_tokens: int) -> Path:
    call = {
        "session_id": "s0",
        "call_index": 0,
        "model": model,
        "arrival_offset_s": 0.0,
        "prompt_tokens": prompt_tokens,
        "new_tokens": prompt_tokens,
        "output_tokens": 10,
        "tool_gap_s": None,
    }
    path.write_text(json.dumps(call) + "\n")
    return path


def test_replay_of_a_model_too_big_for_the_server_ends_with_one_line(tmp_path: Path) -> None:
    # glm-4.5-fp8's 355 GB of weights on the 2.15 GB CPU host: the node's memory accounting
    # would raise CapacityError at the first switch (and the replay deadlock on it).
    trace = _one_call_trace(tmp_path / "t.jsonl", "glm-4.5-fp8", 100)
    args = ["replay", "--trace", str(trace), "--server", "cpu-vllm", "--policies", "talaria"]
    result = runner.invoke(app, [*args, "--no-progress"])
    assert result.exit_code == 1, result.output
    assert _last_line(result.output) == (
        "model 'glm-4.5-fp8' does not fit server 'cpu-vllm': its weights take 355 GB, "
        "a node's usable HBM is 2.15 GB"
    )
    assert "Traceback" not in result.output and "Error" not in result.output


def test_replay_of_a_prompt_too_big_for_the_node_ends_with_one_line(tmp_path: Path) -> None:
    trace = _one_call_trace(tmp_path / "t.jsonl", "glm-4.5-fp8", 2_000_000)
    result = runner.invoke(app, ["replay", "--trace", str(trace), "--policies", "talaria"])
    assert result.exit_code == 1, result.output
    last = _last_line(result.output)
    assert last.startswith("the workload does not fit server 'h200x8': call needs ")
    assert last.endswith("B of KV; node node0 cannot hold it")
    assert "Traceback" not in result.output and "Task was destroyed" not in result.output


def test_replay_ending_in_capacity_error_ends_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import talaria.sim.experiment
    from talaria.runtime.memory.resources import CapacityError

    def overflow(*_: object, **__: object) -> dict[str, Any]:
        raise CapacityError("HBM over capacity: 2e+12 > 1.015e+12")

    monkeypatch.setattr(talaria.sim.experiment, "run_experiment", overflow)
    result = runner.invoke(app, ["replay", "--preset", "small", "--no-progress"])
    assert result.exit_code == 1, result.output
    assert _last_line(result.output) == (
        "the workload does not fit server 'h200x8': HBM over capacity: 2e+12 > 1.015e+12"
    )
    assert "Traceback" not in result.output


def test_version_and_short_help_option() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"talaria {version('talaria')}\n"
    for args in (
        ["-h"],
        ["replay", "-h"],
        ["serve", "-h"],
        ["trace", "-h"],
        ["trace", "generate", "-h"],
    ):
        short, long = runner.invoke(app, args), runner.invoke(app, [*args[:-1], "--help"])
        assert short.exit_code == 0, (args, short.output)
        assert short.output == long.output and "Usage: " in short.output


def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every command under ``command`` (typer's click objects), with its argument path."""
    found = [(path, command)]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        found += _commands(sub, (*path, name))
    return found


def _help_sources(command: Any) -> str:
    """The help texts of a command and of its options, as written in the code."""
    return " ".join([command.help or ""] + [getattr(p, "help", None) or "" for p in command.params])


def test_help_shows_square_brackets_literally() -> None:
    root = typer.main.get_command(app)
    replay_help = flat(runner.invoke(app, ["replay", "--help"]).output)
    assert "(its [profile] is used;" in replay_help
    assert "then a [simulated] answer" in flat(runner.invoke(app, ["serve", "--help"]).output)
    commands = _commands(root)
    assert {("replay",), ("serve",), ("trace", "generate"), ("keys", "create")} < {
        path for path, _ in commands
    }
    for path, command in commands:
        shown = flat(runner.invoke(app, [*path, "--help"]).output)
        for term in re.findall(r"\[([^\]\[]+)\]", _help_sources(command)):
            assert f"[{term}]" in shown, (path, term)


def test_help_cites_only_files_in_the_repository() -> None:
    generate = flat(runner.invoke(app, ["trace", "generate", "--help"]).output)
    assert "docs/sources.md §2" in generate and "docs/trace-format.md" in generate
    root = typer.main.get_command(app)
    for path, _ in _commands(root):
        shown = runner.invoke(app, [*path, "--help"]).output
        assert "FACTS" not in shown and "../shared" not in shown, path
        for cited in re.findall(r"(?:docs|examples)/[\w./-]+\.(?:md|toml)", shown):
            assert (REPO_ROOT / cited).is_file(), (path, cited)


def _serve_without_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """``serve`` arguments on a fresh SQLite store, with no key in the environment."""
    for name in ("API_KEYS", "ALLOW_OPEN", "DATABASE_URL"):
        monkeypatch.delenv(f"TALARIA_{name}", raising=False)
    return ["serve", "--database-url", f"sqlite+aiosqlite:///{tmp_path / 'keys.db'}"]


def test_serve_refuses_a_non_loopback_host_without_any_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started = _no_uvicorn(monkeypatch)
    args = _serve_without_keys(monkeypatch, tmp_path)
    for host in ("0.0.0.0", "192.0.2.10", "::"):
        refused = runner.invoke(app, [*args, "--host", host])
        assert refused.exit_code == 2, refused.output
        text = flat(refused.output)
        assert "Invalid value for '--host': no API keys:" in text
        assert "'talaria keys create'" in text and "--allow-open" in text
        assert "Traceback" not in refused.output
    assert not started
    # Loopback addresses start without looking at the store.
    local = ["serve", "--database-url", f"sqlite+aiosqlite:///{tmp_path / 'local.db'}"]
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert runner.invoke(app, [*local, "--host", host]).exit_code == 0, host
    assert not (tmp_path / "local.db").exists()
    opened = runner.invoke(app, [*args, "--host", "0.0.0.0", "--allow-open"])
    assert opened.exit_code == 0, opened.output
    assert len(started) == 5 and started[-1]["host"] == "0.0.0.0"


def test_serve_on_a_non_loopback_host_starts_with_a_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from talaria.cli.keys import keys_app

    started = _no_uvicorn(monkeypatch)
    args = [*_serve_without_keys(monkeypatch, tmp_path), "--host", "0.0.0.0"]
    monkeypatch.setenv("TALARIA_API_KEYS", "env-key")
    assert runner.invoke(app, args).exit_code == 0
    monkeypatch.delenv("TALARIA_API_KEYS")
    assert runner.invoke(app, args).exit_code == 2
    url = args[2]
    made = runner.invoke(keys_app, ["create", "--url", url])
    assert made.exit_code == 0, made.output
    listed = runner.invoke(keys_app, ["list", "--url", url]).output
    deleted = runner.invoke(keys_app, ["delete", listed.split()[0], "--url", url])
    assert deleted.exit_code == 0, deleted.output
    # A key existed (deleted now): the proxy serves nobody without one, so it may start.
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert len(started) == 2


def test_a_short_admin_token_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 6.1 of the security review: both ``talaria serve`` and ``create_app`` refuse
    a TALARIA_ADMIN_TOKEN under 16 characters, without echoing it."""
    from talaria.proxy.contract.settings import ProxySettings
    from talaria.proxy.edge.app import create_app

    started = _no_uvicorn(monkeypatch)
    monkeypatch.setenv("TALARIA_ADMIN_TOKEN", "adm")
    result = runner.invoke(app, ["serve"])
    assert result.exit_code == 2 and not started
    text = flat(result.output)
    assert "TALARIA_ADMIN_TOKEN must be at least 16 characters (it has 3)" in text
    assert "'adm'" not in text
    with pytest.raises(ValueError, match="at least 16 characters"):
        create_app()
    monkeypatch.setenv("TALARIA_ADMIN_TOKEN", "x" * 16)
    assert ProxySettings().admin_token == "x" * 16


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TALARIA_RESPONSES_TTL_S", "0"),
        ("TALARIA_PLACEMENT_INTERVAL_S", "-1"),
        ("TALARIA_PLACEMENT_KEEP_ALIVE_S", "0"),
    ],
)
def test_a_plugins_bad_setting_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """A plugin's settings live beside it (proxy/placement/settings.py,
    proxy/dialects/responses/settings.py), and are refused as the proxy's own are."""
    from talaria.proxy.edge.app import create_app

    started = _no_uvicorn(monkeypatch)
    monkeypatch.setenv(name, value)
    result = runner.invoke(app, ["serve"])
    assert result.exit_code == 2 and not started
    text = flat(result.output)
    field = name.removeprefix("TALARIA_").lower()
    assert f"1 validation error for ProxySettings {field} Input should be greater than" in text
    with pytest.raises(ValueError, match=f"validation error for ProxySettings\n{field}\n"):
        create_app()


@pytest.mark.parametrize(
    ("headers", "said"),
    [
        ("x acme", "TALARIA_SESSION_HEADERS: 'x acme' is not an HTTP header name"),
        ("x-acme:0", "TALARIA_SESSION_HEADERS: 'x-acme:0': the rank must be 1 to 12"),
    ],
)
def test_a_bad_session_header_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch, headers: str, said: str
) -> None:
    started = _no_uvicorn(monkeypatch)
    monkeypatch.setenv("TALARIA_SESSION_HEADERS", headers)
    result = runner.invoke(app, ["serve"])
    assert result.exit_code == 2 and not started
    assert said in flat(result.output)


def test_a_prompt_pattern_that_is_not_a_regular_expression_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``TALARIA_PROMPT_PATTERNS``: one line naming the bad pattern, exit 2, nothing served."""
    started = _no_uvicorn(monkeypatch)
    monkeypatch.setenv("TALARIA_PROMPT_PATTERNS", "^Today is .*$\n(unclosed")
    result = runner.invoke(app, ["serve"])
    assert result.exit_code == 2 and not started
    said = "TALARIA_PROMPT_PATTERNS: pattern 2 '(unclosed' is not a regular expression"
    assert said in flat(result.output)
