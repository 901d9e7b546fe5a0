"""OpenAI Responses' routes: ``POST /v1/responses``, and for stored responses
``GET /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items`` and
``DELETE /v1/responses/{id}`` (per tenant; proxy/dialects/responses/store.py says what is kept)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from talaria.proxy.callpath.context import context, json_response
from talaria.proxy.callpath.door import SSE_HEADERS, open_call, read_body, tenant_of
from talaria.proxy.contract.calls import ApiCall, CallOutcome
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.contract.records import Record
from talaria.proxy.dialects.base import Dialect, request_body, service_of
from talaria.proxy.dialects.common import outcome_unless_gone
from talaria.proxy.dialects.responses.models import ResponsesRequest
from talaria.proxy.dialects.responses.parse import parse_request, to_call
from talaria.proxy.dialects.responses.render import (
    final_response,
    response_object,
    response_stream,
    stream_error,
)
from talaria.proxy.dialects.responses.settings import ResponsesSettings
from talaria.proxy.dialects.responses.store import Pending, ResponseStore
from talaria.proxy.dialects.responses.tables import StoredResponseView

router = APIRouter()
NAME = "responses"
FORMAT_PARAM = "text.format"
"""Where a Responses request carries its response format."""


def _responses(request: Request) -> ResponseStore:
    """The dialect's stored responses (its service: store.py)."""
    return service_of(request, NAME, ResponseStore)


def _not_found(response_id: str, param: str | None = None) -> ApiError:
    return ApiError(
        404,
        f"Response with id '{response_id}' not found.",
        param=param,
        code="response_not_found",
    )


@router.post("/v1/responses", openapi_extra=request_body(ResponsesRequest))
async def create(request: Request) -> Response:
    """A response (OpenAI's Responses API), streamed with ``stream: true``; stored unless
    ``store: false``, and continued from a stored one with ``previous_response_id``."""
    ctx, raw = await read_body(request)
    tenant, request_id = ctx.tenant, ctx.request_id
    responses = _responses(request)
    parsed = parse_request(raw, request_id)
    del raw  # the JSON's objects: parsed keeps what the call needs (chat/routes.py)
    history: list[Any] = []
    previous_id = parsed.body.previous_response_id
    if previous_id is not None:
        previous = await responses.load(tenant, previous_id)
        if previous is None:
            raise _not_found(previous_id, "previous_response_id")
        history = [*previous.input_items, *previous.response.get("output", [])]
    call = to_call(parsed, history)
    stored = parsed.body.store and responses.enabled
    created = time.time()
    pending: Pending | None = None
    if stored:  # 429 up front past the storage quota (proxy/dialects/responses/quota.py)
        so_far = response_object(
            parsed, request_id, created, status="completed", output=[], usage_doc=None,
            stored=True,
        )  # fmt: skip
        pending = responses.admit(tenant, so_far, [*history, *parsed.items])

    def keep(outcome: CallOutcome) -> list[Record]:
        """The stored response, committed with the call's records."""
        assert pending is not None
        response = final_response(parsed, outcome, request_id, created, True)
        return [responses.prepare(pending, session_key=handle.session_key, response=response)]

    try:
        parsed_call = ApiCall(NAME, call, None, FORMAT_PARAM, keep if pending else None)
        handle = await open_call(ctx, parsed_call)
    except BaseException:
        if pending is not None:
            responses.release(pending)
        raise
    if pending is not None:  # a call that fails stores nothing: its estimate goes
        held = pending
        handle.task.add_done_callback(lambda _: responses.release(held))
    if call.stream:
        return StreamingResponse(
            response_stream(handle, parsed, request_id, created, stored),
            media_type="text/event-stream",
            headers={**handle.headers(), **SSE_HEADERS},
        )
    outcome = await outcome_unless_gone(request, handle)
    return json_response(
        final_response(parsed, outcome, request_id, created, stored), headers=handle.headers()
    )


async def _stored(request: Request, response_id: str) -> StoredResponseView:
    tenant = await tenant_of(context(request), request)
    found = await _responses(request).load(tenant, response_id)
    if found is None:
        raise _not_found(response_id)
    return found


@router.get("/v1/responses/{response_id}")
async def get(response_id: str, request: Request) -> Response:
    return json_response((await _stored(request, response_id)).response)


@router.get("/v1/responses/{response_id}/input_items")
async def input_items(response_id: str, request: Request, order: str = "desc") -> Response:
    items = list((await _stored(request, response_id)).input_items)
    if order == "desc":
        items.reverse()
    elif order != "asc":
        raise ApiError(400, 'order must be "asc" or "desc".', param="order")
    first = items[0]["id"] if items else None
    last = items[-1]["id"] if items else None
    return json_response(
        {"object": "list", "data": items, "first_id": first, "last_id": last, "has_more": False}
    )


@router.delete("/v1/responses/{response_id}")
async def delete(response_id: str, request: Request) -> Response:
    tenant = await tenant_of(context(request), request)
    if not await _responses(request).delete(tenant, response_id):
        raise _not_found(response_id)
    return json_response({"id": response_id, "object": "response", "deleted": True})


DIALECT = Dialect(
    NAME,
    router,
    (ResponsesRequest,),
    stream_error=stream_error,
    service=ResponseStore.of_site,
    settings=ResponsesSettings,
)
