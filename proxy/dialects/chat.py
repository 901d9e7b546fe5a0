"""OpenAI chat completions: ``POST /v1/chat/completions``.

Request → ``Call``: messages as given (``developer`` read as ``system``, text-only content-part
lists joined into a string, tool-call arguments given as objects dumped to JSON), function
tools, ``tool_choice``, sampling (``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``,
penalties, ``logprobs``, ``top_logprobs``, ``response_format``), ``max_completion_tokens`` or
``max_tokens``, ``reasoning_effort``, ``parallel_tool_calls``, vLLM's ``chat_template_kwargs``.
Output → ``chat.completion`` (with ``logprobs`` when asked) or SSE
``chat.completion.chunk``s: the first carries the role, then ``content``,
``reasoning_content`` and ``tool_calls`` deltas as the engine produced them, a last chunk with
``finish_reason``, a usage chunk with ``stream_options.include_usage``, then ``[DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from talaria.core.calls import (
    Call,
    Message,
    ModelOutput,
    OutputDelta,
    Sampling,
    TokenLogprob,
    ToolSpec,
)
from talaria.proxy.calls import CallHandle, CallOutcome
from talaria.proxy.dialects.common import (
    function_tool,
    invalid,
    openai_tool_choice,
    output_events,
    parse,
    sse,
)
from talaria.proxy.errors import ApiError


class FunctionIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    arguments: str | dict[str, Any] = ""


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionIn


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: StrictBool = False


class OpenAICommon(BaseModel):
    """Fields chat and text completions share."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=1, description="only n=1 is supported")
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    user: str | None = None
    prompt_cache_key: str | None = None
    litellm_session_id: str | None = None

    def sampling(self, logprobs: bool, top_logprobs: int | None, fmt: Any) -> Sampling:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=stop,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            response_format=fmt,
        )


class ChatCompletionRequest(OpenAICommon):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: StrictBool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    parallel_tool_calls: StrictBool | None = None
    chat_template_kwargs: dict[str, Any] | None = None


def _content(content: str | list[dict[str, Any]] | None) -> Any:
    """Text-only part lists become one string (what every chat template takes)."""
    if isinstance(content, list) and all(
        p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    return content


def normalize_message(m: ChatMessage) -> Message:
    role = "system" if m.role == "developer" else m.role
    out: Message = {"role": role, "content": _content(m.content)}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id or f"call_{i}",
                "type": "function",
                "function": {
                    "name": c.function.name,
                    "arguments": c.function.arguments
                    if isinstance(c.function.arguments, str)
                    else json.dumps(c.function.arguments),
                },
            }
            for i, c in enumerate(m.tool_calls)
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    if m.reasoning_content:
        out["reasoning_content"] = m.reasoning_content
    return out


def _response_format(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None or value.get("type") == "text":
        return None
    kind = value.get("type")
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise invalid("response_format.json_schema needs a `schema` object.", "response_format")
        return {"type": "json_schema", "json_schema": spec}
    raise invalid(
        'response_format.type must be "text", "json_object" or "json_schema".', "response_format"
    )


def tools_of(entries: list[dict[str, Any]] | None, param: str = "tools") -> tuple[ToolSpec, ...]:
    tools = []
    for i, entry in enumerate(entries or ()):
        spec = function_tool(entry, f"{param}.{i}")
        if spec is not None:
            tools.append(spec)
    return tuple(tools)


def parse_chat(raw: Any) -> Call:
    body = parse(ChatCompletionRequest, raw)
    tools = tools_of(body.tools)
    return Call(
        model=body.model,
        messages=tuple(normalize_message(m) for m in body.messages),
        tools=tools,
        tool_choice=openai_tool_choice(body.tool_choice, tools, "tool_choice"),
        sampling=body.sampling(
            body.logprobs, body.top_logprobs, _response_format(body.response_format)
        ),
        max_output_tokens=body.max_completion_tokens or body.max_tokens,
        stream=body.stream,
        reasoning_effort=body.reasoning_effort,
        parallel_tool_calls=body.parallel_tool_calls,
        template_kwargs=body.chat_template_kwargs,
    )


def include_usage(raw: Any) -> bool:
    options = raw.get("stream_options") if isinstance(raw, dict) else None
    return bool(isinstance(options, dict) and options.get("include_usage"))


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
