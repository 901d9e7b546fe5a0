"""OpenAI text completions' output: a ``text_completion``, or SSE chunks of its text (a usage
chunk with ``stream_options.include_usage``), then ``[DONE]``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from talaria.core.calls import OutputDelta
from talaria.proxy.contract.calls import CallHandle, CallOutcome
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.dialects.chat.render import usage
from talaria.proxy.dialects.common import output_events, sse


def completion(outcome: CallOutcome, base: dict[str, object]) -> dict[str, Any]:
    """The whole ``text_completion`` (``base``: its id, creation time and model)."""
    choice = {
        "index": 0,
        "text": outcome.output.text,
        "finish_reason": outcome.output.finish_reason,
        "logprobs": None,
    }
    return {**base, "object": "text_completion", "choices": [choice], "usage": usage(outcome)}


async def completion_stream(
    handle: CallHandle, base: dict[str, object], with_usage: bool
) -> AsyncIterator[bytes]:
    """The completion as SSE chunks."""
    head = {**base, "object": "text_completion"}

    def chunk(text: str, finish: str | None = None) -> bytes:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        return sse({**head, "choices": [choice]})

    async for event in output_events(handle):
        if isinstance(event, OutputDelta):
            if event.text:
                yield chunk(event.text)
        elif isinstance(event, CallOutcome):
            yield chunk("", event.output.finish_reason)
            if with_usage:
                yield sse({**head, "choices": [], "usage": usage(event)})
        elif isinstance(event, ApiError):
            yield event.sse()
    yield b"data: [DONE]\n\n"
