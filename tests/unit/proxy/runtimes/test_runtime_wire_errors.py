"""A call the engine rejects crosses the runtime's NDJSON stream as a coded error event and
comes out of ``HttpRuntime`` as the same ``CallRejected``; any other failure stays a runtime
fault (``RuntimeUnavailable``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from talaria.core.placement import DemandMeter
from talaria.core.types import CallRejected, CallRequest
from talaria.proxy.runtimes.base import RuntimeUnavailable
from talaria.proxy.runtimes.decoding import decode_event
from talaria.runtime.call_routes import _events

CALL = CallRequest(request_id="r", session_key="s", model="m", prompt_tokens=9, max_output_tokens=1)


class FailingNode:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def stream(self, call: CallRequest) -> AsyncIterator[Any]:
        raise self.exc
        yield  # an async generator that fails before its first event


def _lines(exc: Exception) -> list[dict[str, Any]]:
    async def collect() -> list[bytes]:
        events = _events(FailingNode(exc), CALL, DemandMeter(300.0))  # type: ignore[arg-type]
        return [line async for line in events]

    return [json.loads(line) for line in asyncio.run(collect())]


def test_a_rejected_call_keeps_its_code_and_param_across_the_wire() -> None:
    [event] = _lines(CallRejected("context_length_exceeded", "too long", "messages"))
    assert event == {
        "type": "error",
        "code": "context_length_exceeded",
        "param": "messages",
        "message": "too long",
    }
    with pytest.raises(CallRejected) as info:
        decode_event(event)
    assert (info.value.code, info.value.param, str(info.value)) == (
        "context_length_exceeded",
        "messages",
        "too long",
    )


def test_any_other_failure_is_a_runtime_fault() -> None:
    [event] = _lines(RuntimeError("engine crashed"))
    assert event["type"] == "error" and "code" not in event
    with pytest.raises(RuntimeUnavailable, match="engine crashed"):
        decode_event(event)
