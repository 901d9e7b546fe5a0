"""``POST /v1/completions``."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from talaria.proxy.callpath.context import json_response
from talaria.proxy.callpath.door import SSE_HEADERS, open_call, read_body
from talaria.proxy.contract.calls import ApiCall
from talaria.proxy.dialects.base import Dialect, request_body
from talaria.proxy.dialects.common import outcome_unless_gone, parse
from talaria.proxy.dialects.completions.models import CompletionRequest
from talaria.proxy.dialects.completions.parse import completion_call
from talaria.proxy.dialects.completions.render import completion, completion_stream

router = APIRouter()


@router.post("/v1/completions", openapi_extra=request_body(CompletionRequest))
async def completions(request: Request) -> Response:
    """A text completion (OpenAI's legacy completions API), streamed with ``stream: true``."""
    ctx, raw = await read_body(request)
    body = parse(CompletionRequest, raw)
    del raw  # the JSON's objects: neither they nor the model outlive the parse (common.py)
    call, include_usage = completion_call(body), body.include_usage
    del body
    handle = await open_call(ctx, ApiCall("completions", call))
    base: dict[str, object] = {
        "id": f"cmpl-{ctx.request_id}",
        "created": int(time.time()),
        "model": call.model,
    }
    if call.stream:
        return StreamingResponse(
            completion_stream(handle, base, include_usage),
            media_type="text/event-stream",
            headers={**handle.headers(), **SSE_HEADERS},
        )
    outcome = await outcome_unless_gone(request, handle)
    return json_response(completion(outcome, base), headers=handle.headers())


DIALECT = Dialect("completions", router, (CompletionRequest,))
