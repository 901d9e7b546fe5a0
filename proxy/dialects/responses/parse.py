"""OpenAI Responses, the request: ``POST /v1/responses``.

Request → ``Call``:

- ``instructions`` → a system message; ``input`` (a string, or items) → messages: ``message``
  items by role (``developer`` read as ``system``; ``input_text`` / ``output_text`` parts as
  text), ``function_call`` items → the assistant's ``tool_calls`` (merged with the assistant
  text and ``reasoning`` items around them into one assistant message, as the model produced
  them), ``function_call_output`` → a ``tool`` message. Other item types (built-in tool calls,
  compaction) are skipped; ``item_reference`` is refused. Fields an item type does not define
  are dropped as the request is parsed (items.py), so they are never stored.
- ``previous_response_id``: the stored response's input items and output items come first
  (its ``instructions`` are not carried over, as OpenAI documents).
- function ``tools`` (built-in ones such as web search are left out; Codex's ``namespace``
  groups are opened), ``tool_choice``, ``temperature``, ``top_p``, ``top_logprobs``,
  ``max_output_tokens``, ``text.format`` (``json_schema`` / ``json_object``),
  ``reasoning.effort``, ``parallel_tool_calls``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from talaria.core.calls import Call, Message, Sampling, ToolSpec
from talaria.proxy.callpath.bounds import check_items
from talaria.proxy.dialects.common import invalid, parse
from talaria.proxy.dialects.openai_models import tool_choice
from talaria.proxy.dialects.responses.items import TEXT_PARTS, item_kind, stored_item
from talaria.proxy.dialects.responses.models import (
    JsonSchemaFormat,
    NamespaceTool,
    ResponsesFunctionTool,
    ResponsesRequest,
    ResponsesText,
    ResponsesTool,
)


@dataclass(frozen=True)
class ParsedResponses:
    """A validated request and its own input items."""

    body: ResponsesRequest
    items: list[dict[str, Any]]
    """This request's own input items as the client sent them, with only the fields their
    type defines (items.py), each given an ``id``."""


def parse_request(raw: Any, request_id: str) -> ParsedResponses:
    """The request validated by its model (400 when refused), and its input items."""
    body = parse(ResponsesRequest, raw, status=400)
    if isinstance(body.input, str):
        items: list[dict[str, Any]] = [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": body.input}],
            }
        ]
    else:  # validated: kept as sent (less undefined fields), not as the model re-dumps them
        items = [stored_item(item) for item in raw["input"]]
    for i, item in enumerate(items):
        item.setdefault("id", f"in_{request_id}_{i}")
    return ParsedResponses(body, items)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, Mapping) and p.get("type") in TEXT_PARTS
        )
    return ""


def _reasoning(item: Mapping[str, Any]) -> str:
    return _text(item.get("content")) or _text(item.get("summary"))


def messages_of(instructions: str | None, items: list[dict[str, Any]]) -> tuple[Message, ...]:
    out: list[Message] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    turn: Message | None = None  # the assistant turn being assembled

    def flush() -> None:
        nonlocal turn
        if turn is not None:
            out.append(turn)
            turn = None

    def assistant() -> Message:
        nonlocal turn
        if turn is None:
            turn = {"role": "assistant", "content": ""}
        return turn

    for i, item in enumerate(items):
        kind = item_kind(item)
        where = f"input.{i}"
        if kind == "message":
            role = item.get("role")
            if role == "assistant":
                message = assistant()
                message["content"] += _text(item.get("content"))
            elif role in ("user", "system", "developer"):
                flush()
                out.append(
                    {
                        "role": "system" if role == "developer" else role,
                        "content": _text(item.get("content")),
                    }
                )
            else:
                raise invalid(f"{where}.role must be user, assistant, system or developer.", where)
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise invalid("A function_call item needs a `name` and a `call_id`.", where)
            arguments = item.get("arguments", "")
            call = {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
            assistant().setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise invalid("A function_call_output item needs a `call_id`.", where)
            flush()
            output = item.get("output", "")
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(output)})
        elif kind == "reasoning":
            text = _reasoning(item)
            if text:
                message = assistant()
                message["reasoning_content"] = message.get("reasoning_content", "") + text
        elif kind == "item_reference":
            raise invalid("item_reference inputs are not supported; send the items.", where)
    flush()
    return tuple(out)


def _function(tool: ResponsesFunctionTool) -> ToolSpec:
    return ToolSpec(tool.name, tool.description or "", dict(tool.parameters or {}), tool.strict)


def tools_of(entries: list[ResponsesTool] | None) -> tuple[ToolSpec, ...]:
    """Function tools, and those of Codex's namespaces (built-in tools are left out)."""
    tools: list[ToolSpec] = []
    for entry in entries or ():
        if isinstance(entry, NamespaceTool):  # Codex groups sub-agent tools this way
            tools.extend(_function(t) for t in entry.tools or ())
        elif isinstance(entry, ResponsesFunctionTool):
            tools.append(_function(entry))
    return tuple(tools)


def _response_format(text: ResponsesText | None) -> dict[str, Any] | None:
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if not isinstance(fmt, JsonSchemaFormat):
        return {"type": "json_object"}
    return {
        "type": "json_schema",
        "json_schema": {"name": fmt.name or "output", "schema": fmt.schema_},
    }


def to_call(parsed: ParsedResponses, history: list[dict[str, Any]]) -> Call:
    """The call: ``history`` (a previous response's input and output items) and this
    request's items; a 400 when the two together hold more items than a request may
    (proxy/callpath/bounds.py), so that a chain of responses cannot grow the work of its next
    call without end."""
    body = parsed.body
    if history:
        check_items([*history, *parsed.items], "previous_response_id")
    tools = tools_of(body.tools)
    choice = body.tool_choice
    named = None if choice is None or isinstance(choice, str) else choice.name
    return Call(
        model=body.model,
        messages=messages_of(body.instructions, [*history, *parsed.items]),
        tools=tools,
        tool_choice=tool_choice(choice if isinstance(choice, str) else None, named, tools),
        sampling=Sampling(
            temperature=body.temperature,
            top_p=body.top_p,
            logprobs=body.top_logprobs is not None,
            top_logprobs=body.top_logprobs,
            response_format=_response_format(body.text),
        ),
        max_output_tokens=body.max_output_tokens,
        stream=body.stream,
        reasoning_effort=body.reasoning.effort if body.reasoning else None,
        parallel_tool_calls=body.parallel_tool_calls,
    )
