"""OpenAI-compatible routes: chat completions, completions, models, session hints and ends.

A session id may hold ``/`` (it is any printable ASCII): the session routes take the id as a
path (``{session_id:path}``, the action matched at the end), sent as is or as ``%2F``."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from talaria.proxy.api.calls import SSE_HEADERS, ask_peers, open_call, read_body, tenant_of
from talaria.proxy.api.context import context, json_response, read_json
from talaria.proxy.api.schemas import CHAT_COMPLETIONS, COMPLETIONS, request_body
from talaria.proxy.dialects.chat import chat_completion, chat_stream, include_usage, parse_chat
from talaria.proxy.dialects.common import parse
from talaria.proxy.dialects.completions import completion, completion_stream, parse_completion
from talaria.proxy.errors import ApiError
from talaria.proxy.sessions.identity import MAX_TOOL_GAP_S

router = APIRouter()


@router.post("/v1/chat/completions", openapi_extra=request_body(CHAT_COMPLETIONS))
async def chat_completions(request: Request) -> Response:
    ctx, tenant, raw = await read_body(request)
    call = parse_chat(raw)
    handle, headers = await open_call(request, ctx, tenant, "chat", call, raw)
    request_id = request.state.request_id
    created = int(time.time())
    if call.stream:
        return StreamingResponse(
            chat_stream(handle, request_id, call.model, created, include_usage(raw)),
            media_type="text/event-stream",
            headers={**headers, **SSE_HEADERS},
        )
    outcome = await handle.outcome()
    return json_response(chat_completion(outcome, request_id, call.model, created), headers=headers)


@router.post("/v1/completions", openapi_extra=request_body(COMPLETIONS))
async def completions(request: Request) -> Response:
    ctx, tenant, raw = await read_body(request)
    call = parse_completion(raw)
    handle, headers = await open_call(request, ctx, tenant, "completions", call, raw)
    base: dict[str, object] = {
        "id": f"cmpl-{request.state.request_id}",
        "created": int(time.time()),
        "model": call.model,
    }
    if call.stream:
        return StreamingResponse(
            completion_stream(handle, base, include_usage(raw)),
            media_type="text/event-stream",
            headers={**headers, **SSE_HEADERS},
        )
    outcome = await handle.outcome()
    return json_response(completion(outcome, base), headers=headers)


@router.get("/v1/models")
async def models(request: Request) -> Response:
    """OpenAI's model list; Anthropic's shape when the caller sends ``anthropic-version``."""
    ctx = context(request)
    await tenant_of(ctx, request)
    residency = await ctx.gateway.residency()
    names = ctx.gateway.models()
    data: list[dict[str, object]]
    if request.headers.get("anthropic-version"):
        data = [
            {
                "type": "model",
                "id": m,
                "display_name": m,
                "created_at": "1970-01-01T00:00:00Z",
                "context_window": ctx.gateway.context_window(m),
            }
            for m in names
        ]
        first, last = (names[0], names[-1]) if names else (None, None)
        return json_response({"data": data, "has_more": False, "first_id": first, "last_id": last})
    data = [
        {
            "id": m,
            "object": "model",
            "created": 0,
            "owned_by": "talaria",
            "context_window": ctx.gateway.context_window(m),
            "instances": residency.get(m, []),
        }
        for m in names
    ]
    return json_response({"object": "list", "data": data})


class HintRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expected_s: float | None = Field(
        None, ge=0, le=MAX_TOOL_GAP_S, allow_inf_nan=False, description="expected tool time, s"
    )
    expected_ms: float | None = Field(
        None, ge=0, le=MAX_TOOL_GAP_S * 1000, allow_inf_nan=False, description="the same in ms"
    )
    tool: str | None = Field(None, max_length=200, pattern=r"^[^\x00-\x1f\x7f]*$")

    def seconds(self) -> float | None:
        if self.expected_s is not None:
            return self.expected_s
        return None if self.expected_ms is None else self.expected_ms / 1000.0


@router.post(
    "/v1/sessions/{session_id:path}/hints",
    openapi_extra=request_body(HintRequest.model_json_schema()),
)
async def session_hint(session_id: str, request: Request) -> Response:
    ctx = context(request)
    tenant = await tenant_of(ctx, request)
    raw = await read_json(request, ctx.settings.max_request_bytes)
    hint = parse(HintRequest, raw)
    known = await ctx.gateway.hint(session_id, tenant, hint.seconds(), hint.tool)
    if not known:
        await ask_peers(request, ctx, raw, lambda status, _: status == 200)
        raise ApiError(404, f"No live session {session_id!r}.", code="session_not_found")
    return json_response({"session_id": session_id, "accepted": True})


@router.post("/v1/sessions/{session_id:path}/end")
async def session_end(session_id: str, request: Request) -> Response:
    ctx = context(request)
    tenant = await tenant_of(ctx, request)
    ended = await ctx.gateway.end_session(session_id, "client", tenant)
    if not ended:
        await ask_peers(request, ctx, None, lambda status, doc: status == 200 and _ended(doc))
    return json_response({"session_id": session_id, "ended": ended})


def _ended(doc: object) -> bool:
    return isinstance(doc, dict) and doc.get("ended") is True
