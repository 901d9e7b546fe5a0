"""InstantRuntime: its event sequence, and the proxy serving chat calls through it."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

from fastapi.testclient import TestClient

from talaria.core.status import ModelState
from talaria.core.types import (
    CallRequest,
    Finished,
    FirstToken,
    GenerationEvent,
    KvSource,
    TokenDelta,
)
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.edge.app import create_app
from talaria.runtime.instant import InstantRuntime

MODEL = "bench-model"
KEY = "test-key"


def _request(n: int, *, stream: bool, shared: int | None = None, **extra: object) -> CallRequest:
    return CallRequest(
        request_id=f"r{n}",
        session_key="s1",
        model=MODEL,
        prompt_tokens=100,
        max_output_tokens=4096,
        stream=stream,
        shared_prefix_tokens=shared,
        **extra,  # type: ignore[arg-type]
    )


async def _events(runtime: InstantRuntime, request: CallRequest) -> list[GenerationEvent]:
    return [event async for event in runtime.generate(request)]


def test_streaming_event_sequence_and_kv_source() -> None:
    async def main() -> tuple[list[GenerationEvent], list[GenerationEvent]]:
        runtime = InstantRuntime(models=(MODEL,), output_tokens=12)
        first = await _events(runtime, _request(0, stream=True))
        second = await _events(runtime, _request(1, stream=True, shared=90))
        return first, second

    first, second = asyncio.run(main())
    assert isinstance(first[0], FirstToken)
    assert first[0].kv_source is KvSource.NEW and first[0].cached_tokens == 0
    deltas = first[1:-1]
    assert len(deltas) == 11
    assert all(isinstance(d, TokenDelta) and d.tokens == 1 for d in deltas)
    done = first[-1]
    assert isinstance(done, Finished)
    result = done.result
    assert result.output_tokens == 12 and result.kv_source is KvSource.NEW
    assert result.cached_tokens == 0 and result.node == "instant-0"
    assert result.arrival_s <= result.first_token_s <= result.finished_s

    head = second[0]
    assert isinstance(head, FirstToken) and head.kv_source is KvSource.HBM
    assert head.cached_tokens == 80  # 90 shared tokens floored to 16-token blocks
    tail = second[-1]
    assert isinstance(tail, Finished) and tail.result.cached_tokens == 80


def test_non_streaming_has_no_deltas_and_respects_max_tokens() -> None:
    async def main() -> list[GenerationEvent]:
        runtime = InstantRuntime(models=(MODEL,))
        request = CallRequest("r", "s", MODEL, prompt_tokens=10, max_output_tokens=5)
        return await _events(runtime, request)

    events = asyncio.run(main())
    assert [type(e) for e in events] == [FirstToken, Finished]
    last = events[-1]
    assert isinstance(last, Finished) and last.result.output_tokens == 5


def test_default_output_cap_and_session_forgetting() -> None:
    async def main() -> list[KvSource]:
        runtime = InstantRuntime(models=(MODEL,))
        sources = []
        for n, final in enumerate([False, True, False]):
            events = await _events(runtime, _request(n, stream=False, session_final=final))
            head, done = events[0], events[-1]
            assert isinstance(head, FirstToken) and isinstance(done, Finished)
            assert done.result.output_tokens == 16
            sources.append(head.kv_source)
        await runtime.end_sessions(["s1"])
        events = await _events(runtime, _request(9, stream=False))
        assert isinstance(events[0], FirstToken)
        sources.append(events[0].kv_source)
        return sources

    # call 1 continues call 0; call 1 is final, so call 2 starts afresh; end_session forgets.
    assert asyncio.run(main()) == [KvSource.NEW, KvSource.HBM, KvSource.NEW, KvSource.NEW]


def test_status_reports_every_model_active() -> None:
    runtime = InstantRuntime(models=("a", "b"), name="fast")
    status = asyncio.run(runtime.status())
    assert status.instance == "fast"
    assert set(status.models) == {"a", "b"}
    assert all(
        r.state is ModelState.ACTIVE and r.next_slot_in_s == 0 for r in status.models.values()
    )
    assert runtime.models == ("a", "b")


def test_proxy_serves_chat_through_instant_runtime(tmp_path: Path) -> None:
    db = tmp_path / "proxy.db"
    settings = ProxySettings(database_url=f"sqlite+aiosqlite:///{db}", api_keys=[KEY])
    runtime = InstantRuntime(models=(MODEL,), output_tokens=12)
    app = create_app(settings, runtimes=[runtime])
    headers = {"Authorization": f"Bearer {KEY}", "X-Talaria-Session-Id": "sess-1"}
    messages = [{"role": "user", "content": "hello there " * 40}]
    with TestClient(app) as client:
        reply = client.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": messages}, headers=headers
        )
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-talaria-instance"] == "instant-0"
        body = reply.json()
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["usage"]["completion_tokens"] == 12
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

        follow = [*messages, body["choices"][0]["message"], {"role": "user", "content": "more"}]
        with client.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": MODEL, "messages": follow, "stream": True},
            headers=headers,
        ) as streamed:
            assert streamed.status_code == 200
            lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line[6:]) for line in lines[:-1]]
        content = [c for c in chunks if c["choices"][0]["delta"].get("content")]
        assert len(content) == 12
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert runtime.calls == 2
    # the lifespan closed: the batched writer flushed both calls to SQLite
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT status, kv_source, cached_tokens FROM calls ORDER BY call_index"
        ).fetchall()
    assert [r[:2] for r in rows] == [("ok", "new"), ("ok", "hbm")]
    assert rows[1][2] > 0
