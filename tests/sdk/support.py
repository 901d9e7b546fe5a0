"""Shared by the SDK tests: constants, and a tiny OpenAI-compatible server that is *not*
Talaria (a Starlette app that ignores the session headers and knows no session endpoints),
served by uvicorn on a loopback port."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.integration.server import running_app

ADMIN = "admin-secret-token"
MODEL = "glm-4.5-fp8"
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
Admin = Callable[[str], dict[str, Any]]


# -- a server that is not Talaria ------------------------------------------------------------


@dataclass
class Seen:
    """What the fake server received: (method, path, lower-cased headers, JSON body)."""

    requests: list[tuple[str, str, dict[str, str], Any]] = field(default_factory=list)

    def paths(self) -> list[str]:
        return [path for _, path, _, _ in self.requests]

    def headers(self, path_part: str) -> list[dict[str, str]]:
        return [h for _, p, h, _ in self.requests if path_part in p]


def _chat(body: dict[str, Any]) -> dict[str, Any]:
    tools = bool(body.get("tools"))
    message: dict[str, Any] = {"role": "assistant", "content": None if tools else "hello"}
    if body.get("response_format"):
        message["content"] = json.dumps({"answer": "42"})
    if tools:
        message["tool_calls"] = [
            {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": body.get("model", "m"),
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if tools else "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


async def _chat_stream(body: dict[str, Any]) -> AsyncIterator[bytes]:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    deltas: list[tuple[dict[str, Any], str | None]] = [({"role": "assistant"}, None)]
    if body.get("tools"):
        call = {"index": 0, "id": "call_1", "type": "function"}
        call["function"] = {"name": "bash", "arguments": "{}"}
        deltas += [({"tool_calls": [call]}, None), ({}, "tool_calls")]
    else:
        deltas += [({"content": "hel"}, None), ({"content": "lo"}, None), ({}, "stop")]
    for delta, finish in deltas:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        yield f"data: {json.dumps({**base, 'choices': [choice]})}\n\n".encode()
    yield b"data: [DONE]\n\n"


def _response(body: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    output: list[dict[str, Any]] = [
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "hello", "annotations": []}],
        }
    ]
    if body.get("tools"):
        output = [
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "bash",
                "arguments": "{}",
                "status": "completed",
            }
        ]
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "model": body.get("model", "m"),
        "status": status,
        "output": output if status == "completed" else [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


async def _response_stream(body: dict[str, Any]) -> AsyncIterator[bytes]:
    events = [
        {"type": "response.created", "response": _response(body, "in_progress")},
        {"type": "response.completed", "response": _response(body)},
    ]
    for n, event in enumerate(events):
        event["sequence_number"] = n
        yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def fake_openai_app(seen: Seen, *, talaria_like: bool = False) -> Starlette:
    """Chat completions and responses (plain and streamed). ``talaria_like``: the replies
    carry ``x-talaria-session-id`` like Talaria's, but the session endpoints answer 500."""

    async def record(request: Request) -> Any:
        body = json.loads(await request.body() or b"null")
        headers = {k.lower(): v for k, v in request.headers.items()}
        seen.requests.append((request.method, request.url.path, headers, body))
        return body

    def reply_headers(request: Request) -> dict[str, str]:
        sid = request.headers.get("x-talaria-session-id")
        return {"x-talaria-session-id": sid} if talaria_like and sid else {}

    async def chat(request: Request) -> Response:
        body = await record(request)
        if body.get("stream"):
            stream = _chat_stream(body)
            return StreamingResponse(
                stream, media_type="text/event-stream", headers=reply_headers(request)
            )
        return JSONResponse(_chat(body), headers=reply_headers(request))

    async def responses(request: Request) -> Response:
        body = await record(request)
        if body.get("stream"):
            stream = _response_stream(body)
            return StreamingResponse(
                stream, media_type="text/event-stream", headers=reply_headers(request)
            )
        return JSONResponse(_response(body), headers=reply_headers(request))

    async def session_endpoint(request: Request) -> Response:
        await record(request)
        return JSONResponse({"error": {"message": "broken"}}, status_code=500)

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
    ]
    if talaria_like:
        routes.append(Route("/v1/sessions/{sid}/{action}", session_endpoint, methods=["POST"]))
    return Starlette(routes=routes)


@dataclass
class FakeServer:
    v1: str
    seen: Seen


@contextmanager
def serve(app: Starlette) -> Iterator[str]:
    """``app`` on a free loopback port: its OpenAI-style base URL."""
    with running_app(app, lifespan="off") as base_url:
        yield base_url + "/v1"
