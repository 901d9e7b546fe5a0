"""A small OpenAI-compatible server for the upstream engine's tests (aiohttp, loopback).

It serves ``GET /v1/models`` and ``POST /v1/chat/completions`` (streamed or not) with a
deterministic reply chosen by the last user message:

- ``tool``: a tool call in two argument fragments;
- ``think``: reasoning (as ``reasoning_content``), then text;
- ``slow``: ``slow_chunks`` (200) chunks 20 ms apart (a disconnect is counted);
- ``die``: two chunks, then the connection is cut;
- ``boom``: a 500;
- a prompt past ``max_model_len`` (4 characters a token): vLLM's 400;
- anything else: ``Hello from <model>.`` in three chunks.

Usage carries ``prompt_tokens_details.cached_tokens``: the tokens of the longest earlier
conversation (its messages and reply) of the same ``cache_salt`` (none: one shared cache, as
a server without salts has) this prompt starts with, forgotten at a sleep. It has
vLLM's (``/sleep``, ``/wake_up``, ``/is_sleeping``) and SGLang's
(``/release_memory_occupation``, ``/resume_memory_occupation``) endpoints; a chat call while
asleep is a 500. ``log`` records every request in order: (method, path with query).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from aiohttp import web

CHARS_PER_TOKEN = 4


def _tokens(value: Any) -> int:
    return max(1, len(json.dumps(value)) // CHARS_PER_TOKEN)


class FakeUpstream:
    """One fake server (see the module docstring); ``url`` once started."""

    def __init__(
        self, model: str = "fake-model", max_model_len: int = 256, api_key: str | None = None,
        asleep: bool = False, slow_chunks: int = 200,
        shared: list[tuple[str, str, str]] | None = None, port: int = 0,
    ) -> None:  # fmt: skip
        self.model = model
        self.port = port
        """The port to listen on (0: any free one)."""
        self.max_model_len = max_model_len
        self.api_key = api_key
        self.asleep = asleep
        self.slow_chunks = slow_chunks
        self.shared = shared
        """A log several fakes append to, in one order: (model, method, path with query)."""
        self.log: list[tuple[str, str]] = []
        self.bodies: list[dict[str, Any]] = []
        self.disconnects = 0
        self.completed_streams = 0
        self._done: list[tuple[Any, list[Any]]] = []
        """Finished conversations with their ``cache_salt``: the prefix cache."""
        self.url = ""
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/sleep", self._sleep)
        app.router.add_post("/wake_up", self._wake)
        app.router.add_get("/is_sleeping", self._is_sleeping)
        app.router.add_post("/release_memory_occupation", self._sleep)
        app.router.add_post("/resume_memory_occupation", self._wake)
        return app

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.log.append((request.method, request.path_qs))
        if self.shared is not None:
            self.shared.append((self.model, request.method, request.path_qs))
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        return await handler(request)  # type: ignore[no-any-return]

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app(), handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def switches(self) -> list[str]:
        """The sleep / wake requests in order (paths with queries)."""
        names = ("/sleep", "/wake_up", "/release_memory", "/resume_memory")
        return [p for _, p in self.log if p.startswith(names)]

    # -- endpoints --------------------------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        entry = {"id": self.model, "object": "model", "max_model_len": self.max_model_len}
        return web.json_response({"object": "list", "data": [entry]})

    async def _sleep(self, request: web.Request) -> web.Response:
        self.asleep = True
        self._done.clear()  # the prefix cache is gone
        return web.Response(text="")

    async def _wake(self, request: web.Request) -> web.Response:
        if request.query.get("tags") != "weights":
            self.asleep = False
        return web.Response(text="")

    async def _is_sleeping(self, request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": self.asleep})

    def _reply(self, last: str) -> list[dict[str, Any]]:
        """The reply's deltas."""
        if "tool" in last:
            head = {"index": 0, "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":'}}  # fmt: skip
            tail = {"index": 0, "function": {"arguments": ' "Paris"}'}}
            return [{"role": "assistant"}, {"tool_calls": [head]}, {"tool_calls": [tail]}]
        if "think" in last:
            return [{"reasoning_content": "Let me "}, {"reasoning_content": "think."},
                    {"content": "42"}]  # fmt: skip
        if "slow" in last:
            return [{"content": f"w{i} "} for i in range(self.slow_chunks)]
        return [{"content": "Hello "}, {"content": "from "}, {"content": f"{self.model}."}]

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.asleep:
            return web.json_response({"error": {"message": "asleep"}}, status=500)
        messages = body["messages"]
        last = str(messages[-1].get("content", ""))
        prompt = _tokens(messages)
        if "boom" in last:
            return web.json_response({"error": {"message": "engine crashed"}}, status=500)
        if prompt > self.max_model_len:
            message = (f"This model's maximum context length is {self.max_model_len} tokens. "
                       f"However, your request has {prompt} input tokens.")  # fmt: skip
            doc = {"object": "error", "message": message, "type": "BadRequestError", "code": 400}
            return web.json_response(doc, status=400)
        salt = body.get("cache_salt")
        cached = max(
            (_tokens(d) for s, d in self._done if s == salt and messages[: len(d)] == d),
            default=0,
        )
        deltas = self._reply(last)
        finish = "tool_calls" if "tool" in last else "stop"
        text = "".join(d.get("content", "") for d in deltas)
        usage = {"prompt_tokens": prompt, "completion_tokens": len(deltas),
                 "total_tokens": prompt + len(deltas),
                 "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
        if not body.get("stream"):
            reply = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": reply, "finish_reason": finish}
            return web.json_response({"id": "c1", "choices": [choice], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for i, delta in enumerate(deltas):
                end = i == len(deltas) - 1
                choice = {"index": 0, "delta": delta, "finish_reason": finish if end else None}
                await _event(response, {"id": "c1", "choices": [choice]})
                if "die" in last and i == 1:
                    assert request.transport is not None
                    request.transport.close()
                    return response
                if "slow" in last:
                    await asyncio.sleep(0.02)
            await _event(response, {"id": "c1", "choices": [], "usage": usage})
            await response.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnects += 1
            raise
        self._done.append((salt, [*messages, {"role": "assistant", "content": text}]))
        self.completed_streams += 1
        return response


async def _event(response: web.StreamResponse, doc: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(doc)}\n\n".encode())


@asynccontextmanager
async def fake_upstream(**kwargs: Any) -> AsyncIterator[FakeUpstream]:
    """A started ``FakeUpstream`` in this loop."""
    fake = FakeUpstream(**kwargs)
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


@contextmanager
def fake_upstream_thread(
    kind: type[FakeUpstream] = FakeUpstream, **kwargs: Any
) -> Iterator[FakeUpstream]:
    """A started ``FakeUpstream`` (or subclass ``kind``) on a loop of its own thread (for
    another process, or a server on another loop, to reach)."""
    fake = kind(**kwargs)
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(fake.start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(fake.stop())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    if not ready.wait(30):
        raise RuntimeError("fake upstream did not start")
    try:
        yield fake
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
