"""A client that disconnects before its reply ends cancels its call, through ``talaria serve``
as a real process (proxy/dialects/common.py, proxy/callpath/runner.py ``CallRunner.abandon``, the
node's stream and the simulated engine's abort). The catalog's tiny simulated model on a clock 50×
slower than real time: a token every ~0.25 s, so that a reply (a seeded length, median 150 tokens)
is still being generated when its client leaves."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bench.harness.processes import ServeProcess, talaria_serve
from tests.support import chat_requests

MODEL = "tiny-a"
ADMIN = "disconnect-admin"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    data = tmp_path_factory.mktemp("disconnect")
    args = ["--models", MODEL, "--time-scale", "0.02"]
    with talaria_serve(args, {"TALARIA_ADMIN_TOKEN": ADMIN}, data) as process:
        yield process


def _body(stream: bool, **more: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "stream": stream,
        **more,
    }


def _calls_of(served: ServeProcess, session: str) -> list[dict[str, Any]]:
    """The session's calls once its last is settled (recorded ok, error or cancelled)."""
    headers = {"authorization": f"Bearer {ADMIN}"}
    deadline = time.monotonic() + 30
    while True:
        reply = httpx.get(f"{served.base_url}/admin/sessions/{session}", headers=headers)
        calls: list[dict[str, Any]] = reply.json().get("calls", []) if reply.is_success else []
        if calls and calls[-1]["status"] != "running":
            return calls
        assert time.monotonic() < deadline, calls
        time.sleep(0.1)  # a real process's records: nothing to wait on but the admin API


def test_a_stream_left_after_its_first_chunk_is_cancelled(served: ServeProcess) -> None:
    headers = {"X-Talaria-Session-Id": "gone-streaming"}
    with (
        httpx.Client(timeout=60) as client,
        client.stream(
            "POST", served.v1 + "/chat/completions", json=_body(True), headers=headers
        ) as reply,
    ):
        assert reply.status_code == 200
        # the first chunk that carries text: the call is admitted and generating
        next(line for line in reply.iter_lines() if '"content":"' in line)
    calls = _calls_of(served, "gone-streaming")
    assert [c["status"] for c in calls] == ["cancelled"], calls
    assert "disconnected" in calls[0]["error"]


def test_a_client_that_stops_waiting_for_a_whole_reply_cancels_it(served: ServeProcess) -> None:
    before = chat_requests(served.base_url).get("499", 0.0)
    headers = {"X-Talaria-Session-Id": "gone-waiting"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(served.v1 + "/chat/completions", json=_body(False), headers=headers, timeout=2)
    calls = _calls_of(served, "gone-waiting")
    assert [c["status"] for c in calls] == ["cancelled"], calls
    assert chat_requests(served.base_url).get("499", 0.0) == before + 1


def test_a_client_that_waits_gets_its_reply(served: ServeProcess) -> None:
    headers = {"X-Talaria-Session-Id": "stays"}
    reply = httpx.post(
        served.v1 + "/chat/completions",
        json=_body(False, max_tokens=4),
        headers=headers,
        timeout=120,
    )
    assert reply.status_code == 200
    assert [c["status"] for c in _calls_of(served, "stays")] == ["ok"]
