"""Anthropic Messages routes: ``POST /v1/messages`` (Claude Code adds ``?beta=true``) and
``POST /v1/messages/count_tokens``. Errors on these paths use Anthropic's envelope
(proxy/app.py picks it by path)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from talaria.proxy.api.calls import SSE_HEADERS, check_model, open_call, read_body
from talaria.proxy.api.context import json_response
from talaria.proxy.api.schemas import COUNT_TOKENS, MESSAGES, request_body
from talaria.proxy.dialects.anthropic import (
    message,
    message_stream,
    parse_count_tokens,
    parse_messages,
)

router = APIRouter()
PREFIX = "/v1/messages"


@router.post(PREFIX, openapi_extra=request_body(MESSAGES))
async def messages(request: Request) -> Response:
    ctx, tenant, raw = await read_body(request)
    beta = request.headers.get("anthropic-beta", "")
    call = parse_messages(raw, interleaved_thinking="interleaved-thinking" in beta)
    handle, headers = await open_call(request, ctx, tenant, "messages", call, raw)
    request_id = request.state.request_id
    if call.stream:
        return StreamingResponse(
            message_stream(handle, request_id, call.model, call.prompt_tokens()),
            media_type="text/event-stream",
            headers={**headers, **SSE_HEADERS},
        )
    outcome = await handle.outcome()
    return json_response(message(outcome, request_id, call.model), headers=headers)


@router.post(PREFIX + "/count_tokens", openapi_extra=request_body(COUNT_TOKENS))
async def count_tokens(request: Request) -> Response:
    """The proxy's estimate of the rendered prompt (about 4 bytes of text per token, plus the
    tools and each message's role markers); the engine's tokenizer is not consulted."""
    ctx, _, raw = await read_body(request)
    call = parse_count_tokens(raw)
    check_model(ctx, call.model)
    return json_response({"input_tokens": call.prompt_tokens()})
