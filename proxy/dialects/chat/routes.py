"""``POST /v1/chat/completions``."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from talaria.proxy.callpath.context import json_response
from talaria.proxy.callpath.door import SSE_HEADERS, open_call, read_body
from talaria.proxy.contract.calls import ApiCall
from talaria.proxy.dialects.base import Dialect, request_body
from talaria.proxy.dialects.chat.models import ChatCompletionRequest
from talaria.proxy.dialects.chat.parse import chat_call
from talaria.proxy.dialects.chat.render import chat_completion, chat_stream
from talaria.proxy.dialects.common import outcome_unless_gone, parse

router = APIRouter()


@router.post("/v1/chat/completions", openapi_extra=request_body(ChatCompletionRequest))
async def chat_completions(request: Request) -> Response:
    """A chat completion (OpenAI's chat API), streamed with ``stream: true``."""
    ctx, raw = await read_body(request)
    body = parse(ChatCompletionRequest, raw)
    del raw  # the JSON's objects: neither they nor the model outlive the parse (common.py)
    call, include_usage = chat_call(body), body.include_usage
    del body
    handle = await open_call(ctx, ApiCall("chat", call))
    request_id = ctx.request_id
    created = int(time.time())
    if call.stream:
        return StreamingResponse(
            chat_stream(handle, request_id, call.model, created, include_usage),
            media_type="text/event-stream",
            headers={**handle.headers(), **SSE_HEADERS},
        )
    outcome = await outcome_unless_gone(request, handle)
    reply = chat_completion(outcome, request_id, call.model, created)
    return json_response(reply, headers=handle.headers())


DIALECT = Dialect("chat", router, (ChatCompletionRequest,))
