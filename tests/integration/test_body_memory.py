"""What a request body costs the proxy while its call runs (issue 46, Low: a body's parse held
~5–11× its size), through the proxy's HTTP API over ASGI: once the call runs on the runtime,
the proxy holds the body's content about once (its strings, shared by the parsed call), not
its bytes, its JSON's objects and its dialect's model besides (docs/proxy-overhead.md,
bench/parse_memory.py). tracemalloc counts Python's allocations: the same on every run."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from collections.abc import AsyncGenerator
from pathlib import Path

import httpx
import pytest

from talaria.core.types import CallRequest, GenerationEvent
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.edge.app import create_app
from talaria.runtime.instant import InstantRuntime

MODEL = "m"
RESULT = "x = 1\n" * 50_000  # a 300 kB tool result, six of them: a ~1.8 MB body


class Noting(InstantRuntime):
    """Notes the memory traced when a call starts generating."""

    held_bytes = 0

    async def _generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        if tracemalloc.is_tracing():
            self.held_bytes = tracemalloc.get_traced_memory()[0]
        async for event in super()._generate(request):
            yield event


def _body(path: str, task: int) -> bytes:
    turns = []
    for i in range(6):
        if path == "/v1/messages":
            turns += [
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": f"t{i}", "name": "Read", "input": {"p": i}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": f"t{i}", "content": RESULT}]},
            ]  # fmt: skip
        else:
            call = {"id": f"c{i}", "type": "function",
                    "function": {"name": "read", "arguments": json.dumps({"p": i})}}  # fmt: skip
            turns += [
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"c{i}", "content": RESULT},
            ]
    first = {"role": "user", "content": f"Task {task}: fix the test."}
    body = {"model": MODEL, "max_tokens": 4, "messages": [first, *turns]}
    return json.dumps(body).encode()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_running_call_holds_its_body_about_once(path: str, tmp_path: Path) -> None:
    runtime = Noting((MODEL,), output_tokens=2)
    settings = ProxySettings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'm.db'}")
    app = create_app(settings, runtimes=[runtime])
    headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}

    async def held_over_size() -> float:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as http,
        ):
            warm = await http.post(path, content=_body(path, 0), headers=headers)
            assert warm.status_code == 200, warm.text
            raw = _body(path, 1)
            tracemalloc.start()
            try:
                base = tracemalloc.get_traced_memory()[0]
                reply = await http.post(path, content=raw, headers=headers)
            finally:
                tracemalloc.stop()
            assert reply.status_code == 200, reply.text
            return (runtime.held_bytes - base) / len(raw)

    ratio = asyncio.run(held_over_size())
    assert 0.8 < ratio < 1.3, ratio  # before the fix: 1.9 (its bytes kept besides)
