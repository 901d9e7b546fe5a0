"""The servers of ``bench/proxy_overhead.py``, each run as its own process:

    python bench/overhead/servers.py direct  --port P [--access-log]
    python bench/overhead/servers.py talaria --port P --db PATH [--output-tokens 12] [--access-log]

``direct``: a minimal server (Starlette + uvicorn, one worker) answering at once with what the
proxy's ``InstantRuntime`` would answer, ``REPLY_TOKENS`` words, in each API's shape:
``POST /v1/chat/completions`` (a chat completion, or SSE: a role chunk, one content chunk per
word, a finish chunk and ``[DONE]``), ``POST /v1/messages`` (a message, or SSE: message_start,
ping, one text block with one ``text_delta`` per word, message_delta, message_stop) and
``POST /v1/responses`` (a response, or SSE: created, in_progress, one message item with one
``output_text.delta`` per word, completed).

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

    def event(name: str, data: dict[str, Any]) -> bytes:
        body = json.dumps({"type": name, **data}, separators=(",", ":")).encode()
        return b"event: " + name.encode() + b"\ndata: " + body + b"\n\n"

    def pieces() -> list[str]:
        return [_word(i) if i == 0 else " " + _word(i) for i in range(tokens)]

    async def message_events(message: dict[str, Any]) -> AsyncIterator[bytes]:
        yield event("message_start", {"message": {**message, "content": []}})
        yield event("ping", {})
        yield event(
            "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
        )
        for piece in pieces():
            delta = {"type": "text_delta", "text": piece}
            yield event("content_block_delta", {"index": 0, "delta": delta})
        yield event("content_block_stop", {"index": 0})
        delta = {"stop_reason": "end_turn", "stop_sequence": None}
        yield event("message_delta", {"delta": delta, "usage": {"output_tokens": tokens}})
        yield event("message_stop", {})

    async def messages(request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        message = {
            "id": f"msg_{uuid.uuid4().hex}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", MODEL),
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": max(1, len(raw) // 4), "output_tokens": tokens},
        }
        if body.get("stream"):
            return StreamingResponse(message_events(message), media_type="text/event-stream")
        return Response(json.dumps(message, separators=(",", ":")), media_type="application/json")

    async def response_events(response: dict[str, Any]) -> AsyncIterator[bytes]:
        n = iter(range(10**9))
        start = {**response, "status": "in_progress", "output": []}
        yield event("response.created", {"response": start, "sequence_number": next(n)})
        yield event("response.in_progress", {"response": start, "sequence_number": next(n)})
        item = response["output"][0]
        where = {"item_id": item["id"], "output_index": 0}
        opened = {**item, "status": "in_progress", "content": []}
        yield event(
            "response.output_item.added",
            {"output_index": 0, "item": opened, "sequence_number": next(n)},
        )
        for piece in pieces():
            delta = {**where, "content_index": 0, "delta": piece, "logprobs": []}
            yield event("response.output_text.delta", {**delta, "sequence_number": next(n)})
        yield event(
            "response.output_item.done",
            {"output_index": 0, "item": item, "sequence_number": next(n)},
        )
        yield event("response.completed", {"response": response, "sequence_number": next(n)})

    async def responses(request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        rid = uuid.uuid4().hex
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        prompt = max(1, len(raw) // 4)
        response = {
            "id": f"resp_{rid}",
            "object": "response",
            "created_at": time.time(),
            "status": "completed",
            "model": body.get("model", MODEL),
            "output": [
                {"type": "message", "id": f"msg_{rid}", "role": "assistant",
                 "status": "completed", "content": [part]}
            ],
            "usage": {"input_tokens": prompt, "output_tokens": tokens,
                      "total_tokens": prompt + tokens},
        }  # fmt: skip
        if body.get("stream"):
            return StreamingResponse(response_events(response), media_type="text/event-stream")
        return Response(json.dumps(response, separators=(",", ":")), media_type="application/json")

    async def health(_: Request) -> Response:
        return JSONResponse({"ok": True})

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/chat/completions", chat, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/health", health),
    ]
    return Starlette(routes=routes)


def talaria_app(
    db: str, output_tokens: int, durability: str = "commit", freeze_gc: bool = True
) -> Any:
    from talaria.proxy.contract.settings import ProxySettings
    from talaria.proxy.edge.app import create_app
    from talaria.runtime.instant import InstantRuntime

    # as `talaria serve` runs it: the start-up objects frozen out of the collector's scans
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{db}", durability=durability, freeze_gc=freeze_gc
    )
    runtime = InstantRuntime(models=(MODEL,), output_tokens=output_tokens)
    return create_app(settings, runtimes=[runtime])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=("direct", "talaria"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--db", help="SQLite file of the talaria proxy")
    parser.add_argument("--output-tokens", type=int, default=REPLY_TOKENS)
    parser.add_argument(
        "--durability",
        choices=("commit", "async"),
        default="commit",
        help="talaria: answer after the call's records are committed (default), or at once",
    )
    parser.add_argument("--access-log", action="store_true")
    parser.add_argument(
        "--gc-log",
        action="store_true",
        help="print every garbage collection that takes over 1 ms (`gc <generation> <ms> ms`)",
    )
    parser.add_argument(
        "--no-freeze-gc",
        action="store_true",
        help="talaria: leave the start-up objects in the collector's scans (as before gc.freeze)",
    )
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
        app = talaria_app(
            args.db, args.output_tokens, args.durability, freeze_gc=not args.no_freeze_gc
        )
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
    if args.gc_log:
        _log_gc_pauses()
    server.run()


def _log_gc_pauses() -> None:
    """Print each collection over 1 ms: a full one walks every tracked object, and the event
    loop waits meanwhile."""
    import gc

    started = [0.0]

    def timer(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        took_ms = (time.perf_counter() - started[0]) * 1e3
        if took_ms > 1:
            print(f"gc {info['generation']} {took_ms:.1f} ms", flush=True)

    gc.callbacks.append(timer)


if __name__ == "__main__":
    main()
