"""The servers of ``bench/proxy_overhead.py``, each run as its own process:

    python bench/overhead/servers.py direct  --port P [--access-log]
    python bench/overhead/servers.py talaria --port P --db PATH [--output-tokens 12] [--access-log]

``direct``: a minimal OpenAI-compatible server (Starlette + uvicorn, one worker) answering
``POST /v1/chat/completions`` at once with what the proxy's ``InstantRuntime`` would answer: a
chat completion of ``REPLY_TOKENS`` words, or, with ``"stream": true``, SSE: a role chunk,
``REPLY_TOKENS`` content chunks, a finish chunk and ``[DONE]``.

``talaria``: the Talaria proxy (``create_app``) with one ``InstantRuntime`` hosting
``bench-model``, persistence on (SQLite at ``--db``, the batched writer records every call).

Both run uvicorn exactly as ``talaria serve`` does (loop and HTTP parser ``auto``: whatever the
venv has), access log on or off as asked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

MODEL = "bench-model"
REPLY_TOKENS = 12
WORDS = (
    "simulated", "tokens", "from", "the", "talaria", "engine", "timed", "by", "its", "cost",
    "model", "no", "real", "text", "was", "generated", "here", "session", "aware", "serving",
)  # fmt: skip


def _word(i: int) -> str:
    return "[simulated]" if i == 0 else WORDS[i % len(WORDS)]


def direct_app(tokens: int = REPLY_TOKENS) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    text = " ".join(_word(i) for i in range(tokens))

    def sse(data: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    async def stream(base: dict[str, Any]) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            return sse({**base, "choices": [choice]})

        yield chunk({"role": "assistant", "content": None})
        for i in range(tokens):
            yield chunk({"content": _word(i) if i == 0 else " " + _word(i)})
        yield chunk({}, "stop")
        yield b"data: [DONE]\n\n"

    async def chat(request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": body.get("model", MODEL),
        }
        if body.get("stream"):
            return StreamingResponse(
                stream({**base, "object": "chat.completion.chunk"}),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache"},
            )
        prompt = max(1, len(raw) // 4)
        return Response(
            json.dumps(
                {
                    **base,
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                            "logprobs": None,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": prompt,
                        "completion_tokens": tokens,
                        "total_tokens": prompt + tokens,
                    },
                    "system_fingerprint": None,
                },
                separators=(",", ":"),
            ),
            media_type="application/json",
        )

    async def health(_: Request) -> Response:
        return JSONResponse({"ok": True})

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/chat/completions", chat, methods=["POST"]),
        Route("/health", health),
    ]
    return Starlette(routes=routes)


def talaria_app(db: str, output_tokens: int) -> Any:
    from talaria.proxy.app import create_app
    from talaria.proxy.fake_runtime import InstantRuntime
    from talaria.proxy.settings import ProxySettings

    settings = ProxySettings(database_url=f"sqlite+aiosqlite:///{db}")
    runtime = InstantRuntime(models=(MODEL,), output_tokens=output_tokens)
    return create_app(settings, runtimes=[runtime])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=("direct", "talaria"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--db", help="SQLite file of the talaria proxy")
    parser.add_argument("--output-tokens", type=int, default=REPLY_TOKENS)
    parser.add_argument("--access-log", action="store_true")
    parser.add_argument(
        "--switch-interval",
        type=float,
        help="sys.setswitchinterval (s) for the server: an experiment on how fast the SQLite "
        "worker thread gets the GIL back from a busy event loop (Python's default: 0.005)",
    )
    args = parser.parse_args()

    import uvicorn

    if args.target == "direct":
        app = direct_app(args.output_tokens)
    else:
        if not args.db:
            parser.error("talaria needs --db")
        app = talaria_app(args.db, args.output_tokens)
    # `talaria serve` runs uvicorn.run(app, host, port, log_level): the same here, the access
    # log (uvicorn's default at "info") optional.
    log_level = "info" if args.access_log else "warning"
    config = uvicorn.Config(
        app, host="127.0.0.1", port=args.port, log_level=log_level, access_log=args.access_log
    )
    server = uvicorn.Server(config)
    print(f"bench server {args.target} pid {os.getpid()} port {args.port}", flush=True)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    server.run()


if __name__ == "__main__":
    main()
