"""Anthropic Messages' output, and its errors.

Output → a ``message`` whose content is ``thinking``, ``text`` and ``tool_use`` blocks, or the
SSE events ``message_start``, ``ping``, ``content_block_start`` / ``_delta``
(``thinking_delta`` then ``signature_delta``, ``text_delta``, ``input_json_delta``) /
``_stop``, ``message_delta`` (``stop_reason``, the final usage) and ``message_stop``. Usage:
``input_tokens`` excludes the cached prefix, reported as ``cache_read_input_tokens`` (as
Anthropic counts). Errors use Anthropic's envelope and types.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from talaria.core.calls import ModelOutput, OutputDelta
from talaria.proxy.contract.calls import CallHandle, CallOutcome
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.dialects.anthropic.errors import stream_error
from talaria.proxy.dialects.common import output_events, sse

THINKING_SIGNATURE = "talaria-unsigned"
"""Anthropic clients send thinking blocks back with their signature; no self-hosted model signs
its reasoning, so every block carries this marker."""

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def usage(outcome: CallOutcome) -> dict[str, Any]:
    r = outcome.result
    return {
        "input_tokens": r.prompt_tokens - r.cached_tokens,
        "output_tokens": r.output_tokens,
        "cache_read_input_tokens": r.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def content_blocks(output: ModelOutput) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if output.reasoning:
        blocks.append(
            {"type": "thinking", "thinking": output.reasoning, "signature": THINKING_SIGNATURE}
        )
    if output.text or not output.tool_calls:
        blocks.append({"type": "text", "text": output.text})
    for call in output.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments)}
        )
    return blocks


def _input(arguments: str) -> Any:
    """A tool call's arguments as the object Anthropic clients expect (the raw text, wrapped,
    when the model wrote something that is not a JSON object)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_value": value}


def stop_reason(output: ModelOutput) -> str:
    """``tool_use`` whenever the reply calls a tool (an engine reports a forced call as a
    plain stop, as OpenAI does), else the finish reason's counterpart."""
    if output.tool_calls and output.finish_reason != "length":
        return "tool_use"
    return STOP_REASONS[output.finish_reason]


def message(outcome: CallOutcome, request_id: str, model: str) -> dict[str, Any]:
    return {
        "id": f"msg_{request_id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(outcome.output),
        "stop_reason": stop_reason(outcome.output),
        "stop_sequence": None,
        "usage": usage(outcome),
    }


class _Blocks:
    """The content blocks of a streamed message, opened and closed as the deltas change kind."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None
        self.tool: int | None = None

    def open(self, kind: str, start: dict[str, Any], tool: int | None = None) -> list[bytes]:
        frames = self.close()
        self.index += 1
        self.kind, self.tool = kind, tool
        data = {"type": "content_block_start", "index": self.index, "content_block": start}
        frames.append(sse(data, "content_block_start"))
        return frames

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        frames = []
        if self.kind == "thinking":
            delta = {"type": "signature_delta", "signature": THINKING_SIGNATURE}
            frames.append(self.delta(delta))
        frames.append(
            sse({"type": "content_block_stop", "index": self.index}, "content_block_stop")
        )
        self.kind = self.tool = None
        return frames

    def delta(self, delta: dict[str, Any]) -> bytes:
        data = {"type": "content_block_delta", "index": self.index, "delta": delta}
        return sse(data, "content_block_delta")


def _frames(blocks: _Blocks, delta: OutputDelta) -> list[bytes]:
    frames: list[bytes] = []
    if delta.reasoning:
        if blocks.kind != "thinking":
            frames += blocks.open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        frames.append(blocks.delta({"type": "thinking_delta", "thinking": delta.reasoning}))
    if delta.text:
        if blocks.kind != "text":
            frames += blocks.open("text", {"type": "text", "text": ""})
        frames.append(blocks.delta({"type": "text_delta", "text": delta.text}))
    for part in delta.tool_calls:
        if blocks.kind != "tool_use" or blocks.tool != part.index:
            start = {"type": "tool_use", "id": part.id or "", "name": part.name or "", "input": {}}
            frames += blocks.open("tool_use", start, part.index)
        if part.arguments:
            frames.append(
                blocks.delta({"type": "input_json_delta", "partial_json": part.arguments})
            )
    return frames


async def message_stream(
    handle: CallHandle, request_id: str, model: str, estimated_input_tokens: int
) -> AsyncIterator[bytes]:
    start: dict[str, Any] = {
        "id": f"msg_{request_id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": estimated_input_tokens, "output_tokens": 0},
    }
    yield sse({"type": "message_start", "message": start}, "message_start")
    yield sse({"type": "ping"}, "ping")
    blocks = _Blocks()
    async for event in output_events(handle):
        if isinstance(event, OutputDelta):
            for frame in _frames(blocks, event):
                yield frame
        elif isinstance(event, CallOutcome):
            if blocks.index < 0:  # an empty reply is one empty text block
                for frame in blocks.open("text", {"type": "text", "text": ""}):
                    yield frame
            for frame in blocks.close():
                yield frame
            delta = {"stop_reason": stop_reason(event.output), "stop_sequence": None}
            data = {"type": "message_delta", "delta": delta, "usage": usage(event)}
            yield sse(data, "message_delta")
            yield sse({"type": "message_stop"}, "message_stop")
        elif isinstance(event, ApiError):
            for frame in blocks.close():
                yield frame
            yield stream_error(event)
