"""The runtime's call endpoints: a call's generation and its session's control.

- ``POST /v1/runtime/generate``: a call document → NDJSON, one event document per line
  (core/protocol_calls.py and protocol_events.py; ``_events``); 503 while the runtime drains
  or once its node's loop has ended, 400 for a bad document, 404 for a model the node does
  not host;
- ``POST /v1/runtime/sessions/<key>/hint`` (``{"expected_gap_s": float}``, read by
  ``_gap_s``), ``.../end``, ``.../moved`` (the key may hold ``/``: a thread's), and
  ``POST /v1/runtime/ends`` (several sessions ended at once): core/protocol_sessions.py.

Every call's session as it comes and its engine time as it ends go to the state's demand
meter (runtime/app_state.py), for a placement controller.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator

import msgspec
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from talaria.core.placement import DemandMeter
from talaria.core.protocol import ProtocolError
from talaria.core.protocol_calls import request_from_dict
from talaria.core.protocol_events import ErrorEvent, event_to_dict
from talaria.core.protocol_sessions import (
    ENDS_ROUTE,
    SESSION_ACTIONS,
    SESSION_ROUTE,
    ends_from_dict,
    session_key_ok,
)
from talaria.core.types import CallRejected, CallRequest, Finished, GenerationEvent
from talaria.runtime.app_state import json_response, runtime_of
from talaria.runtime.scheduling.calls import NodeStopped, UnknownModelError
from talaria.runtime.scheduling.node import NodeScheduler

router = APIRouter()
log = logging.getLogger("talaria.runtime")


@router.post("/v1/runtime/generate")
async def generate(request: Request) -> Response:
    """Serve one call, its events streamed as NDJSON (module docstring)."""
    runtime = runtime_of(request)
    if not runtime.ready or runtime.node.failure is not None:
        return json_response({"error": runtime.node.failure or "draining"}, 503)
    try:
        call = request_from_dict(msgspec.json.decode(await request.body()))
    except (ProtocolError, msgspec.DecodeError, RecursionError) as exc:
        return json_response({"error": str(exc)}, 400)
    if call.model not in runtime.node.engines:
        return json_response({"error": f"model {call.model!r} is not on this node"}, 404)
    runtime.demand.arrived(runtime.node.clock.now(), call.model, call.session_key)
    events = _events(runtime.node, call, runtime.demand)
    return StreamingResponse(events, media_type="application/x-ndjson")


@router.post(SESSION_ROUTE)
async def session_control(session_key: str, action: str, request: Request) -> Response:
    """A session's hint, end or move (module docstring)."""
    node = runtime_of(request).node
    if action not in SESSION_ACTIONS:
        return json_response({"error": f"unknown session action {action!r}"}, 404)
    if not session_key_ok(session_key):
        return json_response({"error": "a session key is 1 to 256 characters"}, 400)
    if action == "hint":
        gap_s = _gap_s(await request.body())
        if gap_s is None:
            return json_response(
                {"error": "expected_gap_s must be a finite, non-negative number"}, 400
            )
        node.hint(session_key, gap_s)
    elif action == "end":
        node.end_session(session_key)
    else:
        node.session_moved(session_key)
    return json_response({"ok": True})


@router.post(ENDS_ROUTE)
async def ends(request: Request) -> Response:
    """Several sessions ended at once."""
    try:
        keys = ends_from_dict(msgspec.json.decode(await request.body()))
    except (ProtocolError, msgspec.DecodeError, RecursionError) as exc:
        return json_response({"error": str(exc)}, 400)
    node = runtime_of(request).node
    for key in keys:
        node.end_session(key)
    return json_response({"ok": True, "ended": len(keys)})


def _gap_s(raw: bytes) -> float | None:
    """A hint body's ``expected_gap_s`` in seconds, or None unless it is a finite number ≥ 0
    (JSON parsers take ``NaN`` and ``Infinity``; neither may reach the hold)."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    gap = body.get("expected_gap_s") if isinstance(body, dict) else None
    if isinstance(gap, bool) or not isinstance(gap, int | float):
        return None
    try:
        seconds = float(gap)
    except OverflowError:  # an integer past float's range
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


async def _events(
    node: NodeScheduler, call: CallRequest, demand: DemandMeter
) -> AsyncIterator[bytes]:
    """The call's events as NDJSON lines; a failure ends the stream with an ``ErrorEvent``
    line (the 200 has already gone out). A finished call's engine time goes to ``demand``."""

    def line(event: GenerationEvent | ErrorEvent) -> bytes:
        return msgspec.json.encode(event_to_dict(event)) + b"\n"

    try:
        # closed with this generator (the proxy went away): the call's generation stops too
        async with contextlib.aclosing(node.stream(call)) as events:
            async for event in events:
                yield line(event)
                if isinstance(event, Finished):
                    result = event.result
                    seconds = result.finished_s - result.admitted_s
                    demand.finished(node.clock.now(), call.model, seconds)
                    return
    except (UnknownModelError, NodeStopped) as exc:
        yield line(ErrorEvent(str(exc)))
    except CallRejected as exc:  # the caller's fault: the proxy answers 400 with the code
        yield line(ErrorEvent(str(exc), exc.code, exc.param))
    except Exception as exc:  # reported to the proxy, which fails this call only
        log.exception("call %s failed", call.request_id)
        yield line(ErrorEvent(repr(exc)))
