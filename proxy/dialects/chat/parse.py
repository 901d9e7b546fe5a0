"""OpenAI chat completions, the request: ``POST /v1/chat/completions``.

Request → ``Call``: messages as given (``developer`` read as ``system``, text-only content-part
lists joined into a string, tool-call arguments given as objects dumped to JSON), function
tools, ``tool_choice``, sampling (``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``,
penalties, ``logprobs``, ``top_logprobs``, ``response_format``), ``max_completion_tokens`` or
``max_tokens``, ``reasoning_effort``, ``parallel_tool_calls``, vLLM's ``chat_template_kwargs``.
Custom tools are accepted and not offered to the model.
"""

from __future__ import annotations

import json
from typing import Any

from talaria.core.calls import Call, Message
from talaria.proxy.dialects.chat.models import (
    ChatCompletionRequest,
    ChatContentPart,
    ChatFunctionTool,
    ChatMessage,
    ChatResponseFormat,
    ChatTextFormat,
)
from talaria.proxy.dialects.common import parse
from talaria.proxy.dialects.openai_models import tool_choice


def _content(content: str | list[ChatContentPart] | None) -> Any:
    """Text-only part lists become one string (what every chat template takes); other part
    lists go on as the client sent them."""
    if not isinstance(content, list):
        return content
    if all(p.type == "text" and isinstance(p.text, str) for p in content):
        return "".join(p.text or "" for p in content)
    return [p.model_dump(exclude_unset=True) for p in content]


def normalize_message(m: ChatMessage) -> Message:
    """A chat message in the normalized call's form: ``developer`` read as ``system``, text
    parts joined, tool-call arguments given as objects dumped to JSON."""
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


def _response_format(value: ChatResponseFormat | None) -> dict[str, Any] | None:
    if value is None or (isinstance(value, ChatTextFormat) and value.type == "text"):
        return None
    if isinstance(value, ChatTextFormat):
        return {"type": "json_object"}
    return {
        "type": "json_schema",
        "json_schema": value.json_schema.model_dump(exclude_unset=True, by_alias=True),
    }


def parse_chat(raw: Any) -> Call:
    """The request as a ``Call`` (422 for a body its model refuses)."""
    return chat_call(parse(ChatCompletionRequest, raw))


def chat_call(body: ChatCompletionRequest) -> Call:
    """The validated request as a ``Call``."""
    tools = tuple(t.function.spec() for t in body.tools or () if isinstance(t, ChatFunctionTool))
    choice = body.tool_choice
    named = None if choice is None or isinstance(choice, str) else choice.function.name
    return Call(
        model=body.model,
        messages=tuple(normalize_message(m) for m in body.messages),
        tools=tools,
        tool_choice=tool_choice(choice if isinstance(choice, str) else None, named, tools),
        sampling=body.sampling(
            body.logprobs, body.top_logprobs, _response_format(body.response_format)
        ),
        max_output_tokens=body.max_completion_tokens or body.max_tokens,
        stream=body.stream,
        reasoning_effort=body.reasoning_effort,
        parallel_tool_calls=body.parallel_tool_calls,
        template_kwargs=body.chat_template_kwargs,
    )
