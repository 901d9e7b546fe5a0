"""Talaria's session routes: tool-gap hints and ends (what the SDK sends, docs/sdk.md).

A session id may hold ``/`` (it is any printable ASCII): the session routes take the id as a
path (``{session_id:path}``, the action matched at the end), sent as is or as ``%2F``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from talaria.proxy.callpath.context import context, json_response, read_json
from talaria.proxy.callpath.door import ask_peers, tenant_of
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.dialects.base import request_body
from talaria.proxy.dialects.common import parse
from talaria.proxy.sessions.identity import MAX_TOOL_GAP_S

router = APIRouter()


class HintRequest(BaseModel):
    """A tool-gap hint: the tool the agent runs now and how long it expects it to take."""

    model_config = ConfigDict(extra="forbid")

    expected_s: float | None = Field(
        None, ge=0, le=MAX_TOOL_GAP_S, allow_inf_nan=False, description="expected tool time, s"
    )
    expected_ms: float | None = Field(
        None, ge=0, le=MAX_TOOL_GAP_S * 1000, allow_inf_nan=False, description="the same in ms"
    )
    tool: str | None = Field(None, max_length=200, pattern=r"^[^\x00-\x1f\x7f]*$")

    def seconds(self) -> float | None:
        """The expected tool time in seconds, if given."""
        if self.expected_s is not None:
            return self.expected_s
        return None if self.expected_ms is None else self.expected_ms / 1000.0


@router.post(
    "/v1/sessions/{session_id:path}/hints",
    openapi_extra=request_body(HintRequest),
)
async def session_hint(session_id: str, request: Request) -> Response:
    """The session is running a tool now, for about ``expected_s`` (counted as at most
    ``TALARIA_MAX_HINT_GAP_S``): its reservation and routing take the hint (404 when no live
    session has that id)."""
    ctx = context(request)
    tenant = await tenant_of(ctx, request)
    raw = await read_json(request, ctx.settings.max_request_bytes)
    hint = parse(HintRequest, raw)
    expected_s = hint.seconds()
    if expected_s is not None:
        expected_s = min(expected_s, ctx.settings.max_hint_gap_s)
    known = await ctx.keeper.hint(session_id, tenant, expected_s, hint.tool)
    if not known:
        await ask_peers(request, ctx, raw, lambda status, _: status == 200)
        raise ApiError(404, f"No live session {session_id!r}.", code="session_not_found")
    return json_response({"session_id": session_id, "accepted": True})


@router.post("/v1/sessions/{session_id:path}/end")
async def session_end(session_id: str, request: Request) -> Response:
    """The session is over: its reservation goes and its KV may be dropped."""
    ctx = context(request)
    tenant = await tenant_of(ctx, request)
    ended = await ctx.keeper.end_session(session_id, "client", tenant) is not None
    if not ended:
        await ask_peers(request, ctx, None, lambda status, doc: status == 200 and _ended(doc))
    return json_response({"session_id": session_id, "ended": ended})


def _ended(doc: object) -> bool:
    return isinstance(doc, dict) and doc.get("ended") is True
