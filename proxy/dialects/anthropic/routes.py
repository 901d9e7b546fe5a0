"""``POST /v1/messages`` (Claude Code adds ``?beta=true``) and
``POST /v1/messages/count_tokens``; errors on these routes take Anthropic's envelope."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from talaria.proxy.callpath.context import json_response
from talaria.proxy.callpath.door import SSE_HEADERS, check_model, open_call, read_body
from talaria.proxy.contract.calls import ApiCall
from talaria.proxy.dialects.anthropic.errors import error_body, stream_error
from talaria.proxy.dialects.anthropic.models import CountTokensRequest, MessagesRequest
from talaria.proxy.dialects.anthropic.parse import messages_call, parse_count_tokens
from talaria.proxy.dialects.anthropic.render import message, message_stream
from talaria.proxy.dialects.base import Dialect, request_body
from talaria.proxy.dialects.common import outcome_unless_gone, parse

router = APIRouter()


@router.post("/v1/messages", openapi_extra=request_body(MessagesRequest))
async def messages(request: Request) -> Response:
    """A message (Anthropic's Messages API), streamed with ``stream: true``."""
    ctx, raw = await read_body(request)
    beta = request.headers.get("anthropic-beta", "")
    body = parse(MessagesRequest, raw, status=400)
    del raw  # the JSON's objects: neither they nor the model outlive the parse (common.py)
    call = messages_call(body, interleaved_thinking="interleaved-thinking" in beta)
    del body
    handle = await open_call(ctx, ApiCall("messages", call))
    request_id = ctx.request_id
    if call.stream:
        return StreamingResponse(
            message_stream(handle, request_id, call.model, call.prompt_tokens()),
            media_type="text/event-stream",
            headers={**handle.headers(), **SSE_HEADERS},
        )
    outcome = await outcome_unless_gone(request, handle)
    return json_response(message(outcome, request_id, call.model), headers=handle.headers())


@router.post("/v1/messages/count_tokens", openapi_extra=request_body(CountTokensRequest))
async def count_tokens(request: Request) -> Response:
    """The proxy's estimate of the rendered prompt (about 4 bytes of text per token, plus the
    tools and each message's role markers); the engine's tokenizer is not consulted."""
    ctx, raw = await read_body(request)
    call = parse_count_tokens(raw)
    await check_model(ctx.proxy, call.model)
    return json_response({"input_tokens": call.prompt_tokens()})


DIALECT = Dialect(
    "anthropic",
    router,
    (MessagesRequest, CountTokensRequest),
    error=error_body,
    stream_error=stream_error,
)
