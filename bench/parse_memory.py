"""How much memory a request body costs the proxy: the high-water mark over one call, and
what the call still holds while it runs on the runtime, as multiples of the body's size.

    .venv/bin/python bench/parse_memory.py [--messages 40 400] [--tool-bytes 300 20000]

One proxy app in this process (SQLite in a temporary folder, a runtime that answers at once),
driven over ASGI; each API's body shaped like a coding agent's turn (bench/dialect_parse.py:
a long system prompt, 20 tools, ``--messages`` history messages whose tool results are
``--tool-bytes`` long). tracemalloc traces the third call of each shape (the first two warm
the caches): its peak above the memory traced before the request, and the memory traced when
its runtime starts generating (what the call holds for as long as it runs). tracemalloc sees
Python's allocations only, which is what a body becomes. docs/proxy-overhead.md has the
figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import tracemalloc
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import httpx
from dialect_parse import chat_body, messages_body

from talaria.core.types import CallRequest, GenerationEvent
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.edge.app import create_app
from talaria.runtime.instant import InstantRuntime

MODEL = "m"
BODIES = {"/v1/chat/completions": chat_body, "/v1/messages": messages_body}


class HeldNow(InstantRuntime):
    """Notes the memory traced when a call starts generating."""

    held_bytes = 0

    async def _generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        if tracemalloc.is_tracing():
            self.held_bytes = tracemalloc.get_traced_memory()[0]
        async for event in super()._generate(request):
            yield event


def body_of(path: str, messages: int, tool_bytes: int, task: int) -> bytes:
    """The API's agent body with ``messages`` history messages, tool results of
    ``tool_bytes``, a first user message of its own (a new session each time)."""
    body: dict[str, Any] = BODIES[path](messages // 2)
    body.update(model=MODEL, stream=False)
    result = ("x = 1\n" * (tool_bytes // 6 + 1))[:tool_bytes]
    for message in body["messages"]:
        if message["role"] == "tool":
            message["content"] = result
        elif message["role"] == "user" and isinstance(message["content"], list):
            for block in message["content"]:
                if block.get("type") == "tool_result":
                    block["content"] = result
    first = body["messages"][0] if path == "/v1/messages" else body["messages"][1]
    first["content"] = f"Task {task}: fix the failing test."
    return json.dumps(body).encode()


async def measure(messages: int, tool_bytes: int) -> list[tuple[str, int, float, float]]:
    """(path, body bytes, peak ÷ size, held ÷ size) of each API."""
    runtime = HeldNow((MODEL,), output_tokens=4)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        settings = ProxySettings(database_url=f"sqlite+aiosqlite:///{Path(folder) / 'm.db'}")
        app = create_app(settings, runtimes=[runtime])
        headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as http,
        ):
            for path in BODIES:
                for task in range(3):
                    raw = body_of(path, messages, tool_bytes, task)
                    if task == 2:
                        tracemalloc.start()
                        base = tracemalloc.get_traced_memory()[0]
                    reply = await http.post(path, content=raw, headers=headers)
                    assert reply.status_code == 200, reply.text
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                size = len(raw)
                rows.append((path, size, (peak - base) / size, (runtime.held_bytes - base) / size))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, nargs="+", default=[40, 400])
    parser.add_argument("--tool-bytes", type=int, nargs="+", default=[300, 20_000])
    args = parser.parse_args()
    print("| API | history messages | tool result bytes | body kB | peak × body | held × body |")
    print("|---|---|---|---|---|---|")
    for messages in args.messages:
        for tool_bytes in args.tool_bytes:
            for path, size, peak, held in asyncio.run(measure(messages, tool_bytes)):
                print(
                    f"| {path} | {messages} | {tool_bytes:,} | {size / 1e3:,.0f} | "
                    f"{peak:.2f} | {held:.2f} |"
                )


if __name__ == "__main__":
    main()
