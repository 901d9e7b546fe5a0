"""A hostile OpenAI-compatible server (aiohttp, loopback) for the upstream engine's bounds:
``FakeUpstream`` (tests/fake_upstream.py) for any other model, plus, by the request's
``model``:

- ``endless-line``: one SSE line that never ends (64 KiB pieces of ``x``);
- ``big-reply``: valid chunks of 1,000 characters each, 64 MiB in all, then usage and
  ``[DONE]`` (whatever ``max_tokens`` says);
- ``comments``: an SSE comment every 20 ms, never a chunk;
- ``lying-usage``: a normal reply whose usage claims 2e9 prompt, output and cached tokens;

and, under other roots (a node places ``{url}/endless`` and so on): ``GET /endless/v1/models``,
a model list that never ends; ``/leak/v1/models``, a page of "secrets" (a metrics page);
``/leak500/v1/models``, a 500 whose JSON error carries one.

Whatever never ends here stops after ``CAP_BYTES`` (or ``CAP_S`` for the comments), so that
code without bounds fails its test rather than hanging it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from aiohttp import web

from tests.fake_upstream import FakeUpstream

HOSTILE = ("endless-line", "big-reply", "comments", "lying-usage")
CAP_BYTES = 80 << 20
BIG_REPLY_BYTES = 64 << 20
CAP_S = 15.0
PIECE = b"x" * 65536
SECRET = "SECRET-talaria_internal_metric 42"


def _event(doc: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(doc)}\n\n".encode()


def _chunk(content: str) -> bytes:
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": None}
    return _event({"id": "c1", "choices": [choice]})


class HostileUpstream(FakeUpstream):
    """The fake server with the hostile models and roots of the module docstring."""

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_get("/endless/v1/models", self._endless_models)
        app.router.add_get("/leak/v1/models", self._leak)
        app.router.add_get("/leak500/v1/models", self._leak500)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        ids = (self.model, *HOSTILE)
        data = [{"id": m, "object": "model", "max_model_len": self.max_model_len} for m in ids]
        return web.json_response({"object": "list", "data": data})

    async def _endless_models(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        entries = b'{"id": "m", "object": "model"}, ' * 2048
        await _pour(response, b'{"object": "list", "data": [', entries)
        return response

    async def _leak(self, request: web.Request) -> web.Response:
        return web.Response(text=SECRET)

    async def _leak500(self, request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": SECRET}}, status=500)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        model = body.get("model")
        if model not in HOSTILE:
            return await super()._chat(request)
        self.bodies.append(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if model == "endless-line":
            await _pour(response, b"data: ", PIECE)
        elif model == "big-reply":
            await _pour(response, b"", _chunk("y" * 1000), BIG_REPLY_BYTES)
            usage = {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18}
            await _finish(response, usage)
        elif model == "comments":
            loop = asyncio.get_running_loop()
            until = loop.time() + CAP_S
            with contextlib.suppress(ConnectionError):
                while loop.time() < until:
                    await response.write(b": keep-alive\n\n")
                    await asyncio.sleep(0.02)
        else:  # lying-usage
            for word in ("Hello ", "from ", "a liar."):
                await response.write(_chunk(word))
            lie = 2_000_000_000
            usage = {"prompt_tokens": lie, "completion_tokens": lie, "total_tokens": 2 * lie,
                     "prompt_tokens_details": {"cached_tokens": lie}}  # fmt: skip
            await _finish(response, usage)
        return response


async def _pour(
    response: web.StreamResponse, head: bytes, piece: bytes, cap_bytes: int = CAP_BYTES
) -> None:
    """``head``, then ``piece`` again and again up to ``cap_bytes`` or the client leaving."""
    sent = 0
    with contextlib.suppress(ConnectionError):
        await response.write(head)
        while sent < cap_bytes:
            await response.write(piece)
            sent += len(piece)


async def _finish(response: web.StreamResponse, usage: dict[str, Any]) -> None:
    with contextlib.suppress(ConnectionError):
        await response.write(_event({"id": "c1", "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
