"""A live run exported as a trace and replayed: the real ``openai`` client drives sessions
through the proxy (uvicorn on a loopback port, embedded simulated runtime, SQLite file), then
``talaria trace export`` turns the stored calls into a trace that ``talaria replay`` accepts.

The runtime runs at time scale 1: at a scale k the stored queue/prefill times are simulated
seconds (k × wall), so a trace's ``ttft_s`` could not be compared with its wall ``latency_s``.
gpt-oss-120b (65 GB of weights) keeps the first call's model load under a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
from typer.testing import CliRunner

from talaria.cli import app
from talaria.core.trace import read_trace
from talaria.proxy.contract.settings import ProxySettings
from tests.integration.server import running_proxy

ADMIN = "admin-secret-token"
MODEL = "gpt-oss-120b"
SESSIONS = ("agent-a", "agent-b")


def test_live_run_exports_a_replayable_trace(tmp_path: Path) -> None:
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path}/proxy.db",
        admin_token=ADMIN,
        models=[MODEL],
        time_scale=1.0,
        routing_seed=0,
    )
    with running_proxy(settings) as proxy:
        client = openai.OpenAI(base_url=proxy.v1, api_key="local", max_retries=0)
        history: dict[str, list[dict[str, str]]] = {
            sid: [{"role": "user", "content": f"{sid}: fix the failing test " * 40}]
            for sid in SESSIONS
        }
        for step in range(3):  # the sessions take turns: each one's tool gap is the other's call
            for sid, messages in history.items():
                reply = client.chat.completions.create(
                    model=MODEL,
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=8,
                    extra_headers={"X-Talaria-Session-Id": sid},
                )
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                messages.append({"role": "user", "content": f"tool output {step} " * 10})
        # admin reads flush the batched writer first: every call is in the store after this
        keys = []  # the trace names sessions by the proxy's keys
        for sid in SESSIONS:
            detail = httpx.get(
                f"{proxy.base_url}/admin/sessions/{sid}",
                headers={"Authorization": f"Bearer {ADMIN}"},
            )
            assert len(detail.json()["calls"]) == 3
            keys.append(detail.json()["session"]["session_key"])
        runner = CliRunner()
        out = tmp_path / "live.jsonl"
        exported = runner.invoke(
            app, ["trace", "export", "--db", settings.database_url or "", "--out", str(out)]
        )
        assert exported.exit_code == 0, exported.output
        assert "exported 2 sessions, 6 calls" in exported.stderr

    sessions = read_trace(out)
    assert sorted(s.session_id for s in sessions) == sorted(keys)
    for session in sessions:
        assert session.model == MODEL and session.num_calls == 3
        assert session.agent == "openai"  # the openai client's User-Agent, as the proxy saw it
        first, *later = session.calls
        assert first.new_tokens == first.prompt_tokens
        for prev, call in zip(session.calls, later, strict=False):
            assert 0 < call.new_tokens <= call.prompt_tokens
            assert call.prompt_tokens > prev.prompt_tokens  # the history grows
            assert call.cached_tokens is not None and call.cached_tokens > 0
            assert call.arrival_offset_s >= prev.arrival_offset_s
        assert all(c.tool_gap_s is not None and c.tool_gap_s >= 0 for c in session.calls[:-1])
        assert session.calls[-1].tool_gap_s is None
        for c in session.calls:
            assert c.latency_s is not None and c.ttft_s is not None
            assert c.latency_s >= c.ttft_s >= 0

    doc_path = tmp_path / "replay.json"
    replayed = runner.invoke(
        app,
        [
            "replay",
            "--trace",
            str(out),
            "--policies",
            "talaria",
            "--no-progress",
            "--json",
            str(doc_path),
        ],
    )
    assert replayed.exit_code == 0, replayed.output
    doc = json.loads(doc_path.read_text())
    assert (doc["sessions"], doc["calls"]) == (2, 6)
    assert doc["policies"]["talaria"]["calls_completed"] == 6
