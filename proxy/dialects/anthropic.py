"""Anthropic Messages: ``POST /v1/messages`` (also ``?beta=true``) and
``POST /v1/messages/count_tokens``.

Request → ``Call`` (the same conversion vLLM's Anthropic front end makes into OpenAI form):

- ``system`` (a string or text blocks, joined by newlines) → a system message, and so is a
  ``system`` message among the ``messages`` (Claude Code sends its environment notes so);
- user text (and image) blocks → a user message; each ``tool_result`` block → a ``tool``
  message (``tool_call_id`` = its ``tool_use_id``; an ``is_error`` result is prefixed so);
- assistant ``text`` → content, ``tool_use`` → ``tool_calls`` (``input`` dumped to JSON),
  ``thinking`` → ``reasoning_content``; ``redacted_thinking`` and server-tool blocks dropped;
- ``tools`` with an ``input_schema`` → function tools (Anthropic-defined server tools, which no
  self-hosted engine runs, are left out); ``tool_choice`` ``auto | any | tool | none`` →
  auto, required, named, none;
- ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop_sequences``; ``thinking``
  enabled (a budget of at least 1024 tokens, below ``max_tokens`` but with interleaved
  thinking) or adaptive asks for reasoning; ``stream`` is a JSON boolean; ``metadata``,
  ``cache_control`` (prefix reuse is automatic here), ``context_management``,
  ``output_config``, ``service_tier`` accepted;
- ``count_tokens`` is validated as a Messages request without ``max_tokens``.

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
from typing import Any, Literal, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from talaria.core.calls import (
    Call,
    Message,
    ModelOutput,
    OutputDelta,
    Sampling,
    ToolChoice,
    ToolSpec,
)
from talaria.proxy.calls import CallHandle, CallOutcome
from talaria.proxy.dialects.common import invalid, output_events, parse, sse
from talaria.proxy.errors import ApiError

THINKING_SIGNATURE = "talaria-unsigned"
"""Anthropic clients send thinking blocks back with their signature; no self-hosted model signs
its reasoning, so every block carries this marker."""

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}
STATUS = {422: 400, 503: 529}
"""Anthropic reports validation failures as 400 and an overloaded service as 529."""


class Block(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant", "system"]
    """``system`` mid-conversation: Claude Code sends its environment notes so."""
    content: str | list[Block]


class ToolIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class CountTokensRequest(BaseModel):
    """A Messages request without ``max_tokens``: what ``count_tokens`` validates (as
    Anthropic's does, so that a body it accepts is one ``/v1/messages`` would take)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    messages: list[MessageIn]
    system: str | list[Block] | None = None
    stop_sequences: list[str] | None = None
    stream: StrictBool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    tools: list[ToolIn] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)


def _text_of(blocks: str | list[Block] | list[dict[str, Any]] | None) -> str:
    if blocks is None:
        return ""
    if isinstance(blocks, str):
        return blocks
    parts = []
    for block in blocks:
        data = block.model_dump() if isinstance(block, Block) else block
        if data.get("type") == "text" and isinstance(data.get("text"), str):
            parts.append(data["text"])
    return "\n".join(parts)


def _nested_text(value: Any, where: str) -> str:
    """The text of a block's nested content (a ``tool_result``'s ``content``, a document's
    ``source.content``): a string, or a list of blocks whose text blocks are joined."""
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list) and all(isinstance(b, dict) for b in value):
        return _text_of(value)
    raise invalid(f"{where} must be a string or a list of content blocks.", where)


def _source(data: dict[str, Any], where: str) -> dict[str, Any]:
    """An image or document block's ``source`` object (absent: empty)."""
    source = data.get("source")
    if source is None:
        return {}
    if not isinstance(source, dict):
        raise invalid(f"{where}.source must be an object.", f"{where}.source")
    return source


def _tool_result(data: dict[str, Any], where: str) -> Message:
    tool_use_id = data.get("tool_use_id")
    if not isinstance(tool_use_id, str):
        raise invalid("A tool_result block needs a `tool_use_id`.", where)
    text = _nested_text(data.get("content"), f"{where}.content")
    if data.get("is_error"):
        text = f"[tool error] {text}"
    return {"role": "tool", "tool_call_id": tool_use_id, "content": text}


def _user(blocks: list[Block], where: str) -> list[Message]:
    out: list[Message] = []
    parts: list[dict[str, Any]] = []

    def flush() -> None:
        if parts:
            texts = [p["text"] for p in parts if p.get("type") == "text"]
            content: Any = "".join(texts) if len(texts) == len(parts) else list(parts)
            out.append({"role": "user", "content": content})
            parts.clear()

    for i, block in enumerate(blocks):
        data = block.model_dump()
        if block.type == "tool_result":
            flush()
            out.append(_tool_result(data, f"{where}.content.{i}"))
        elif block.type == "text":
            parts.append({"type": "text", "text": str(data.get("text", ""))})
        elif block.type == "image":
            source = _source(data, f"{where}.content.{i}")
            if source.get("type") == "base64":
                url = f"data:{source.get('media_type')};base64,{source.get('data')}"
            else:
                url = str(source.get("url", ""))
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif block.type == "document":
            block_at = f"{where}.content.{i}"
            content = _source(data, block_at).get("content")
            parts.append(
                {"type": "text", "text": _nested_text(content, f"{block_at}.source.content")}
            )
    flush()
    return out


def _assistant(blocks: list[Block], where: str) -> Message:
    text, reasoning, calls = [], [], []
    for i, block in enumerate(blocks):
        data = block.model_dump()
        if block.type == "text":
            text.append(str(data.get("text", "")))
        elif block.type == "thinking":
            reasoning.append(str(data.get("thinking", "")))
        elif block.type == "tool_use":
            name, call_id = data.get("name"), data.get("id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise invalid(
                    "A tool_use block needs an `id` and a `name`.", f"{where}.content.{i}"
                )
            arguments = json.dumps(data.get("input") or {})
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
    message: Message = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return message


def messages_of(system: str | list[Block] | None, messages: list[MessageIn]) -> tuple[Message, ...]:
    out: list[Message] = []
    if system:
        out.append({"role": "system", "content": _text_of(system)})
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
        elif m.role == "system":
            out.append({"role": "system", "content": _text_of(m.content)})
        elif m.role == "user":
            out.extend(_user(m.content, where))
        else:
            out.append(_assistant(m.content, where))
    return tuple(out)


def tools_of(tools: list[ToolIn] | None) -> tuple[ToolSpec, ...]:
    return tuple(
        ToolSpec(t.name, t.description or "", t.input_schema)
        for t in tools or ()
        if t.input_schema is not None and t.type in (None, "custom")
    )


def _tool_choice(value: dict[str, Any] | None, tools: tuple[ToolSpec, ...]) -> ToolChoice:
    if value is None:
        return ToolChoice("auto")
    kind = value.get("type")
    if kind in ("auto", "none"):
        return ToolChoice(kind)
    if kind == "any":
        return ToolChoice("required")
    if kind == "tool":
        name = value.get("name")
        if isinstance(name, str) and name in {t.name for t in tools}:
            return ToolChoice("named", name)
        raise invalid(f"tool_choice names `{name}`, which is not among the tools.", "tool_choice")
    raise invalid('tool_choice.type must be "auto", "any", "tool" or "none".', "tool_choice")


MIN_THINKING_BUDGET = 1024
"""Anthropic's least ``thinking.budget_tokens``."""


def _check_thinking(
    thinking: dict[str, Any] | None, max_tokens: int | None, interleaved: bool
) -> None:
    """``thinking`` as Anthropic takes it: ``{"type": "disabled"}``, ``{"type": "adaptive"}``,
    or ``{"type": "enabled", "budget_tokens": N}`` with N a whole number of at least 1024 and,
    but with interleaved thinking (the ``anthropic-beta`` header, where the budget spans a
    whole turn), less than ``max_tokens``."""
    if thinking is None or thinking.get("type") in ("disabled", "adaptive"):
        return
    if thinking.get("type") != "enabled":
        raise invalid('thinking.type must be "enabled", "disabled" or "adaptive".', "thinking.type")
    budget = thinking.get("budget_tokens")
    if not _whole(budget) or budget < MIN_THINKING_BUDGET:
        raise invalid(
            f"thinking.budget_tokens must be an integer of at least {MIN_THINKING_BUDGET}.",
            "thinking.budget_tokens",
        )
    if max_tokens is not None and not interleaved and budget >= max_tokens:
        raise invalid(
            "thinking.budget_tokens must be less than max_tokens.", "thinking.budget_tokens"
        )


def _whole(value: object) -> TypeGuard[int | float]:
    """An integer, or a float without a fraction (JSON schema's integer); not a boolean."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _effort(thinking: dict[str, Any] | None) -> str | None:
    """``thinking`` as a reasoning effort: disabled → none; enabled or adaptive → medium (its
    ``budget_tokens`` has no equivalent in the chat template); absent → the model's default."""
    kind = (thinking or {}).get("type")
    if kind == "disabled":
        return "none"
    return "medium" if kind in ("enabled", "adaptive") else None


def _checked(
    body: CountTokensRequest, max_tokens: int | None, interleaved: bool
) -> tuple[tuple[ToolSpec, ...], ToolChoice]:
    """What a Messages request and a count_tokens request must both satisfy beyond their
    fields' types: messages, tool choice, thinking. Their tools and tool choice."""
    if not body.messages:
        raise invalid("messages: at least one message is required.", "messages")
    tools = tools_of(body.tools)
    choice = _tool_choice(body.tool_choice, tools)
    _check_thinking(body.thinking, max_tokens, interleaved)
    return tools, choice


def parse_messages(raw: Any, *, interleaved_thinking: bool = False) -> Call:
    """``interleaved_thinking``: the request's ``anthropic-beta`` names it."""
    body = parse(MessagesRequest, raw, status=400)
    tools, choice = _checked(body, body.max_tokens, interleaved_thinking)
    parallel = (body.tool_choice or {}).get("disable_parallel_tool_use")
    return Call(
        model=body.model,
        messages=messages_of(body.system, body.messages),
        tools=tools,
        tool_choice=choice,
        sampling=Sampling(
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            stop=tuple(body.stop_sequences or ()),
        ),
        max_output_tokens=body.max_tokens,
        stream=body.stream,
        reasoning_effort=_effort(body.thinking),
        parallel_tool_calls=None if parallel is None else not parallel,
    )


def parse_count_tokens(raw: Any) -> Call:
    """Validated as a Messages request without ``max_tokens``."""
    body = parse(CountTokensRequest, raw, status=400)
    tools, choice = _checked(body, None, interleaved=False)
    return Call(
        model=body.model,
        messages=messages_of(body.system, body.messages),
        tools=tools,
        tool_choice=choice,
    )


def error_body(error: ApiError) -> tuple[int, dict[str, Any]]:
    """(status, body) of an error in Anthropic's envelope."""
    status = STATUS.get(error.status, error.status)
    kind = ERROR_TYPES.get(
        error.status, "api_error" if error.status >= 500 else "invalid_request_error"
    )
    return status, {"type": "error", "error": {"type": kind, "message": error.message}}


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
            _, body = error_body(event)
            yield sse(body, "error")
