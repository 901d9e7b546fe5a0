"""The real coding-agent CLIs, unchanged, headless against ``talaria serve`` on loopback: Claude
Code (Anthropic Messages), Codex (OpenAI Responses) and Qwen Code (OpenAI chat completions).

The CLIs come from npm at the versions scripts/agents.sh pins; scripts/test.sh installs them and
sets ``TALARIA_AGENT_BIN``. Each runs a short task in a temporary directory with a temporary
HOME, against a proxy of its own (embedded simulated runtime, 100× real time): its replies call
a harmless offered tool three times, then answer, so the run ends by itself. Each test asserts:
exit 0 within 120 s, every request answered 2xx, and the admin API showing the run as one
session (no children: the tasks start no sub-agent) with at least two calls and cached tokens on
every continuation.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.proxy.contract.settings import ProxySettings
from tests.integration.server import RunningProxy, StatusLog, running_proxy
from tests.support import unavailable

MODEL = "glm-4.5-fp8"
ADMIN = "admin-secret-token"
TIMEOUT_S = 120
TASK = "list the files in this directory"


@pytest.fixture(scope="module")
def agent_bin() -> Path:
    found = os.environ.get("TALARIA_AGENT_BIN")
    if not found:
        unavailable("TALARIA_AGENT_BIN is not set (scripts/test.sh installs the CLIs and sets it)")
    return Path(found)


@dataclass
class Served:
    proxy: RunningProxy
    statuses: StatusLog
    home: Path
    work: Path

    def admin(self, path: str) -> dict[str, Any]:
        data: dict[str, Any] = self.proxy.admin(path)
        return data

    def run(self, argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
        base = {"PATH": os.environ["PATH"], "HOME": str(self.home), "LANG": "C.UTF-8"}
        done = subprocess.run(
            argv,
            cwd=self.work,
            env={**base, **env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, f"{argv[0]} failed:\n{done.stdout}\n{done.stderr}"
        return done

    def roots(self) -> list[dict[str, Any]]:
        sessions = self.admin("/admin/sessions?limit=200")["data"]
        roots = [s for s in sessions if s["parent_session_key"] is None]
        return [self.admin(f"/admin/sessions/{s['session_key']}") for s in roots]


@pytest.fixture
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Served]:
    """A proxy of the test's own; ``@pytest.mark.time_scale(k)`` sets its clock (default 100×:
    the agent's own time between calls then counts 100×, too)."""
    marker = request.node.get_closest_marker("time_scale")
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path}/proxy.db",
        admin_token=ADMIN,
        time_scale=marker.args[0] if marker else 100.0,
    )
    statuses = StatusLog(None)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "README.md").write_text("# a project\n")
    with running_proxy(settings, statuses=statuses) as proxy:
        yield Served(proxy, statuses, home, work)


def _check_session(detail: dict[str, Any], source: str, agent: str) -> None:
    """One agent run: one session, with no children (none of these tasks starts a sub-agent,
    and children are never guessed), ≥ 2 calls, every continuation served from cached KV; the
    agent's kind from its own User-Agent (docs/sources.md §9)."""
    calls = detail["calls"]
    assert detail["session"]["identity_source"] == source
    assert detail["session"]["agent"] == agent
    assert detail["children"] == []
    assert len(calls) >= 2 and all(c["status"] == "ok" for c in calls)
    assert calls[0]["cached_tokens"] == 0
    assert all(c["cached_tokens"] > 0 for c in calls[1:]), [c["cached_tokens"] for c in calls]
    assert [c["finish_reason"] for c in calls][-1] in ("stop", "length")


def _all_2xx(served: Served, path: str) -> None:
    mine = [s for _, p, s in served.statuses.seen if p.startswith(path)]
    assert mine and all(200 <= s < 300 for s in mine), served.statuses.seen


def test_claude_code(agent_bin: Path, served: Served) -> None:
    env = {
        "ANTHROPIC_BASE_URL": served.proxy.base_url,
        "ANTHROPIC_API_KEY": "local",
        "ANTHROPIC_MODEL": MODEL,
        "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    for _ in range(2):  # two runs: two sessions
        done = served.run([str(agent_bin / "claude"), "-p", TASK, "--model", MODEL], **env)
        assert "[simulated]" in done.stdout
    _all_2xx(served, "/v1/messages")
    roots = served.roots()
    assert len(roots) == 2
    for detail in roots:
        _check_session(detail, "claude-code", "claude-cli")
        assert all(c["api"] == "messages" for c in detail["calls"])
        # its attribution line, sent by default, taken out (proxy/sessions/normalise.py)
        assert all(c["normalised"] == ["claude-code-attribution"] for c in detail["calls"])


def test_codex(agent_bin: Path, served: Served) -> None:
    codex_home = served.home / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        f'model = "{MODEL}"\n'
        'model_provider = "talaria"\n'
        "[model_providers.talaria]\n"
        'name = "Talaria"\n'
        f'base_url = "{served.proxy.v1}"\n'
        'env_key = "TALARIA_API_KEY"\n'
        'wire_api = "responses"\n'
    )
    done = served.run(
        [str(agent_bin / "codex"), "exec", "--skip-git-repo-check", TASK],
        CODEX_HOME=str(codex_home),
        TALARIA_API_KEY="local",
    )
    assert "[simulated]" in done.stdout
    _all_2xx(served, "/v1/responses")
    [detail] = served.roots()
    _check_session(detail, "codex", "codex_exec")  # `codex exec`'s originator
    assert all(c["api"] == "responses" for c in detail["calls"])


@pytest.mark.time_scale(1.0)  # real time, so that the agent's real tool gaps are the gaps
def test_qwen_code_gets_an_implicit_session_and_reservations_without_hints(
    agent_bin: Path, served: Served
) -> None:
    done = served.run(
        [str(agent_bin / "qwen"), "-p", TASK, "--auth-type", "openai"],
        OPENAI_BASE_URL=served.proxy.v1,
        OPENAI_API_KEY="local",
        OPENAI_MODEL=MODEL,
    )
    assert "[simulated]" in done.stdout
    _all_2xx(served, "/v1/chat/completions")
    [detail] = served.roots()
    _check_session(detail, "implicit", "qwencode")
    # Qwen Code sends no session id and no hints: the proxy reserved the session's instance
    # after each tool-call reply (learned gaps), and the session came back to it
    released = [r["release_reason"] for r in detail["reservations"]]
    assert released == ["returned"] * (len(detail["calls"]) - 1)
    metrics = httpx.get(served.proxy.base_url + "/metrics").text
    hits = [line for line in metrics.splitlines() if 'outcome="hit"' in line]
    assert hits and float(hits[0].split()[-1]) >= 1
