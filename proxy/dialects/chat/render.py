"""OpenAI chat completions' output: a ``chat.completion`` (with ``logprobs`` when asked), or
SSE ``chat.completion.chunk``s: the first carries the role, then ``content``,
``reasoning_content`` and ``tool_calls`` deltas as the engine produced them, a last chunk with
``finish_reason``, a usage chunk with ``stream_options.include_usage``, then ``[DONE]``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from talaria.core.calls import ModelOutput, OutputDelta, TokenLogprob
from talaria.proxy.contract.calls import CallHandle, CallOutcome
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.dialects.common import output_events, sse


def usage(outcome: CallOutcome) -> dict[str, Any]:
    r = outcome.result
    return {
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.output_tokens,
        "total_tokens": r.prompt_tokens + r.output_tokens,
        "prompt_tokens_details": {"cached_tokens": r.cached_tokens},
    }


def _message(output: ModelOutput) -> dict[str, Any]:
    message = output.as_message()
    if output.tool_calls and not output.text:
        message["content"] = None
    return message


def logprobs_doc(logprobs: tuple[TokenLogprob, ...]) -> dict[str, Any] | None:
    """OpenAI's ``logprobs`` of a choice: ``{"content": [{token, logprob, bytes,
    top_logprobs}]}``; None when there are none."""
    if not logprobs:
        return None
    return {
        "content": [
            {
                "token": p.token,
                "logprob": p.logprob,
                "bytes": list(p.token.encode()),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in p.top
                ],
            }
            for p in logprobs
        ]
    }


def chat_completion(
    outcome: CallOutcome, request_id: str, model: str, created: int
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": _message(outcome.output),
                "finish_reason": outcome.output.finish_reason,
                "logprobs": logprobs_doc(outcome.output.logprobs),
            }
        ],
        "usage": usage(outcome),
        "system_fingerprint": None,
    }


def _delta(delta: OutputDelta) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if delta.reasoning:
        out["reasoning_content"] = delta.reasoning
    if delta.text:
        out["content"] = delta.text
    if delta.tool_calls:
        calls = []
        for part in delta.tool_calls:
            entry: dict[str, Any] = {"index": part.index}
            function: dict[str, Any] = {"arguments": part.arguments}
            if part.id is not None:
                entry["id"] = part.id
                entry["type"] = "function"
            if part.name is not None:
                function["name"] = part.name
            entry["function"] = function
            calls.append(entry)
        out["tool_calls"] = calls
    return out


async def chat_stream(
    handle: CallHandle, request_id: str, model: str, created: int, with_usage: bool
) -> AsyncIterator[bytes]:
    base = {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        return sse({**base, "choices": [choice]})

    yield chunk({"role": "assistant", "content": ""})
    async for event in output_events(handle):
        if isinstance(event, OutputDelta):
            yield chunk(_delta(event), logprobs=logprobs_doc(event.logprobs))
        elif isinstance(event, CallOutcome):
            yield chunk({}, event.output.finish_reason)
            if with_usage:
                yield sse({**base, "choices": [], "usage": usage(event)})
        elif isinstance(event, ApiError):
            yield event.sse()
    yield b"data: [DONE]\n\n"
