"""What the dialects share: request validation, a call's output as a stream of deltas, SSE
framing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypeVar

import msgspec
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from talaria.core.calls import OutputDelta
from talaria.proxy.callpath.bounds import check_request
from talaria.proxy.contract.calls import CallAbandoned, CallHandle, CallOutcome
from talaria.proxy.contract.errors import ApiError

M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], data: Any, status: int = 422) -> M:
    """Validate ``data`` (a body ``parse_json`` read: its strings are Unicode text); a failure
    becomes an ``ApiError`` (``status``) naming the field. Of
    several errors (a value none of a union's members takes) the deepest is reported: the
    member the value came closest to. First, a 400 for a body that holds more than a request
    may (proxy/callpath/bounds.py: its items, tools, other lists' entries), whose validation
    alone would hold the event loop."""
    if not isinstance(data, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_value")
    check_request(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        deepest = max(exc.errors(), key=lambda e: len(e["loc"]))
        param = _param(deepest["loc"], data, deepest["type"] == "missing") or None
        raise ApiError(
            status, f"Invalid request: {param}: {deepest['msg']}", param=param, code="invalid_value"
        ) from exc


def _param(loc: tuple[int | str, ...], data: Any, missing: bool) -> str:
    """An error's location as the body's path: the parts found in ``data`` (and a missing
    field's name); the others name the member of a union pydantic tried (``str``, a tag such
    as ``function_call``) and are left out."""
    found: list[str] = []
    here = data
    for i, part in enumerate(loc):
        if _holds(here, part):
            here = here[part]
        elif not (missing and i == len(loc) - 1):
            continue
        found.append(str(part))
    return ".".join(found)


def _holds(value: Any, part: int | str) -> bool:
    """Whether ``value`` has ``part``: an index of a list, or a key of an object."""
    if isinstance(value, list):
        return isinstance(part, int) and 0 <= part < len(value)
    return isinstance(value, dict) and part in value


def invalid(message: str, param: str) -> ApiError:
    """A 400 ``invalid_value`` naming ``param``."""
    return ApiError(400, message, param=param, code="invalid_value")


async def output_events(handle: CallHandle) -> AsyncIterator[OutputDelta | CallOutcome | ApiError]:
    """The call's output as the engine streamed it: ``OutputDelta``s, then the ``CallOutcome``
    (or an ``ApiError``). An engine that streamed nothing has its whole output handed out as
    deltas just before the outcome, so every renderer sees the same sequence. Closed before
    its end (the client went away: the server cancels the stream), the call is abandoned."""
    seen = False
    ended = False
    try:
        while True:
            kind, value = await handle.events.get()
            if kind in ("first", "delta"):
                if value is not None and not value.empty:
                    seen = True
                    yield value
            elif kind == "done":
                ended = True
                outcome: CallOutcome = value
                if not seen:
                    for delta in outcome.output.deltas():
                        yield delta
                yield outcome
                return
            elif kind == "error":
                ended = True
                yield value
                return
    finally:
        if not ended:
            handle.abandon()


async def outcome_unless_gone(request: Request, handle: CallHandle) -> CallOutcome:
    """The call's outcome (or its ``ApiError`` raised) for a client waiting for a whole reply;
    a client that disconnects first has its call abandoned (the engine stops generating it)
    and ``CallAbandoned`` raised: no one is left to answer (proxy/edge/http.py counts a 499)."""
    waiting = asyncio.ensure_future(handle.outcome())
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        waiting.cancel()
        raise
    finally:
        gone.cancel()
    if waiting.done():
        return waiting.result()
    waiting.cancel()
    handle.abandon()
    raise CallAbandoned()


async def _disconnect(request: Request) -> None:
    """Return when the client disconnects (its body was read whole: the server's next
    message is ``http.disconnect``)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


_ENCODER = msgspec.json.Encoder()


def sse(data: Mapping[str, Any], event: str | None = None) -> bytes:
    """One SSE frame (``event:`` line when named)."""
    body = b"data: " + _ENCODER.encode(data) + b"\n\n"
    return (b"event: " + event.encode() + b"\n" + body) if event else body
