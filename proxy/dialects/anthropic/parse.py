"""Anthropic Messages, the request: ``POST /v1/messages`` (also ``?beta=true``) and
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
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from talaria.core.calls import Call, Message, Sampling, ToolChoice, ToolSpec
from talaria.proxy.dialects.anthropic.models import (
    AnthropicToolChoice,
    Base64Source,
    Block,
    CountTokensRequest,
    DocumentBlock,
    ImageBlock,
    MessageIn,
    MessagesRequest,
    TextBlock,
    Thinking,
    ThinkingBlock,
    ThinkingEnabled,
    ToolIn,
    ToolResultBlock,
    ToolUseBlock,
    UrlSource,
)
from talaria.proxy.dialects.common import invalid, parse


def _text_of(blocks: str | Sequence[BaseModel] | None) -> str:
    """The text blocks' text, joined by newlines (a string as it is)."""
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    return "\n".join(b.text for b in blocks if isinstance(b, TextBlock))


def _tool_result(block: ToolResultBlock) -> Message:
    text = _text_of(block.content)
    if block.is_error:
        text = f"[tool error] {text}"
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}


def _image_url(source: Base64Source | UrlSource) -> str:
    if isinstance(source, Base64Source):
        return f"data:{source.media_type};base64,{source.data}"
    return source.url


def _user(blocks: list[Block]) -> list[Message]:
    """A user turn: its text, image and document blocks as one user message (a string when
    all are text), each ``tool_result`` as a tool message, in order."""
    out: list[Message] = []
    parts: list[dict[str, Any]] = []

    def flush() -> None:
        if parts:
            texts = [p["text"] for p in parts if p.get("type") == "text"]
            content: Any = "".join(texts) if len(texts) == len(parts) else list(parts)
            out.append({"role": "user", "content": content})
            parts.clear()

    for block in blocks:
        if isinstance(block, ToolResultBlock):
            flush()
            out.append(_tool_result(block))
        elif isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.source)}})
        elif isinstance(block, DocumentBlock):
            content = block.source.content if block.source is not None else None
            parts.append({"type": "text", "text": _text_of(content)})
    flush()
    return out


def _assistant(blocks: list[Block]) -> Message:
    """An assistant turn: text, thinking as ``reasoning_content``, ``tool_use`` as
    ``tool_calls`` (``input`` dumped to JSON)."""
    text, reasoning, calls = [], [], []
    for block in blocks:
        if isinstance(block, TextBlock):
            text.append(block.text)
        elif isinstance(block, ThinkingBlock):
            reasoning.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": json.dumps(block.input)},
                }
            )
    message: Message = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return message


def messages_of(
    system: str | list[TextBlock] | None, messages: list[MessageIn]
) -> tuple[Message, ...]:
    """The conversation in the normalized call's form (the module docstring says how)."""
    out: list[Message] = []
    if system:
        out.append({"role": "system", "content": _text_of(system)})
    for m in messages:
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
        elif m.role == "system":
            out.append({"role": "system", "content": _text_of(m.content)})
        elif m.role == "user":
            out.extend(_user(m.content))
        else:
            out.append(_assistant(m.content))
    return tuple(out)


def tools_of(tools: list[ToolIn] | None) -> tuple[ToolSpec, ...]:
    """Custom tools as the call's tools (server tools, which no self-hosted engine runs, are
    left out)."""
    return tuple(
        ToolSpec(t.name, t.description or "", t.input_schema)
        for t in tools or ()
        if t.input_schema is not None and t.type in (None, "custom")
    )


def _tool_choice(value: AnthropicToolChoice | None, tools: tuple[ToolSpec, ...]) -> ToolChoice:
    if value is None or value.type == "auto":
        return ToolChoice("auto")
    if value.type == "none":
        return ToolChoice("none")
    if value.type == "any":
        return ToolChoice("required")
    name = value.name
    if name in {t.name for t in tools}:
        return ToolChoice("named", name)
    raise invalid(f"tool_choice names `{name}`, which is not among the tools.", "tool_choice")


def _check_thinking(thinking: Thinking | None, max_tokens: int | None, interleaved: bool) -> None:
    """An enabled budget (at least 1024: its model) is less than ``max_tokens``, but with
    interleaved thinking (the ``anthropic-beta`` header, where the budget spans a whole
    turn)."""
    if not isinstance(thinking, ThinkingEnabled) or max_tokens is None or interleaved:
        return
    if thinking.budget_tokens >= max_tokens:
        raise invalid(
            "thinking.budget_tokens must be less than max_tokens.", "thinking.budget_tokens"
        )


def _effort(thinking: Thinking | None) -> str | None:
    """``thinking`` as a reasoning effort: disabled → none; enabled or adaptive → medium (its
    ``budget_tokens`` has no equivalent in the chat template); absent → the model's default."""
    if thinking is None:
        return None
    return "none" if thinking.type == "disabled" else "medium"


def _checked(
    body: CountTokensRequest, max_tokens: int | None, interleaved: bool
) -> tuple[tuple[ToolSpec, ...], ToolChoice]:
    """What a Messages request and a count_tokens request must both satisfy beyond their
    models: the tool choice among the tools, the thinking budget. Their tools and choice."""
    tools = tools_of(body.tools)
    choice = _tool_choice(body.tool_choice, tools)
    _check_thinking(body.thinking, max_tokens, interleaved)
    return tools, choice


def parse_messages(raw: Any, *, interleaved_thinking: bool = False) -> Call:
    """``interleaved_thinking``: the request's ``anthropic-beta`` names it."""
    return messages_call(parse(MessagesRequest, raw, status=400), interleaved_thinking)


def messages_call(body: MessagesRequest, interleaved_thinking: bool = False) -> Call:
    """The validated Messages request as a ``Call``."""
    tools, choice = _checked(body, body.max_tokens, interleaved_thinking)
    parallel = body.tool_choice.disable_parallel_tool_use if body.tool_choice else None
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
