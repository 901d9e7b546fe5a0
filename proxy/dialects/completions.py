"""OpenAI text completions: ``POST /v1/completions`` (one prompt per request).

Request → ``Call`` with a text ``prompt`` and the shared sampling fields; output → a
``text_completion`` or SSE chunks of its text, then ``[DONE]``. A text prompt is not a
conversation, so without an explicit session id each call is a session of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pydantic import Field

from talaria.core.calls import Call, OutputDelta
from talaria.proxy.calls import CallHandle, CallOutcome
from talaria.proxy.dialects.chat import OpenAICommon, usage
from talaria.proxy.dialects.common import invalid, output_events, parse, sse
from talaria.proxy.errors import ApiError


class CompletionRequest(OpenAICommon):
    prompt: str | list[str]
    logprobs: int | None = Field(None, ge=0, le=5)


def parse_completion(raw: Any) -> Call:
    body = parse(CompletionRequest, raw)
    if isinstance(body.prompt, list) and len(body.prompt) != 1:
        raise invalid("Only one prompt per request is supported.", "prompt")
    prompt = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
    logprobs = body.logprobs is not None
    return Call(
        model=body.model,
        prompt=prompt,
        sampling=body.sampling(logprobs, body.logprobs, None),
        max_output_tokens=body.max_tokens,
        stream=body.stream,
    )


def completion(outcome: CallOutcome, base: dict[str, object]) -> dict[str, Any]:
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
