"""OpenAI Responses: ``POST /v1/responses`` (and the stored responses' ``GET`` / ``DELETE``).

Request → ``Call``:

- ``instructions`` → a system message; ``input`` (a string, or items) → messages: ``message``
  items by role (``developer`` read as ``system``; ``input_text`` / ``output_text`` parts as
  text), ``function_call`` items → the assistant's ``tool_calls`` (merged with the assistant
  text and ``reasoning`` items around them into one assistant message, as the model produced
  them), ``function_call_output`` → a ``tool`` message. Other item types (built-in tool calls,
  compaction) are skipped; ``item_reference`` is refused. Fields an item type does not define
  are dropped as the request is parsed (responses_items.py), so they are never stored.
- ``previous_response_id``: the stored response's input items and output items come first
  (its ``instructions`` are not carried over, as OpenAI documents).
- function ``tools`` (built-in ones such as web search are left out; Codex's ``namespace``
  groups are opened), ``tool_choice``, ``temperature``, ``top_p``, ``top_logprobs``,
  ``max_output_tokens``, ``text.format`` (``json_schema`` / ``json_object``),
  ``reasoning.effort``, ``parallel_tool_calls``.

Output: ``reasoning`` (its text as ``reasoning_text`` content), ``message`` (``output_text``)
and ``function_call`` items, ``status`` ``completed`` or ``incomplete`` (``max_output_tokens``),
usage with ``input_tokens_details.cached_tokens``. Streaming sends ``response.created``,
``response.in_progress``, then per item ``response.output_item.added``, its content part, its
deltas (``response.reasoning_text.delta``, ``response.output_text.delta``,
``response.function_call_arguments.delta``), their ``.done`` events and
``response.output_item.done``, and finally ``response.completed`` (or ``response.incomplete``,
or ``response.failed``), each with a ``sequence_number``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from talaria.core.calls import Call, Message, ModelOutput, OutputDelta, Sampling, ToolSpec
from talaria.proxy.calls import CallHandle, CallOutcome
from talaria.proxy.dialects.common import (
    function_tool,
    invalid,
    openai_tool_choice,
    output_events,
    parse,
    sse,
)
from talaria.proxy.dialects.responses_items import TEXT_PARTS, item_kind, stored_item
from talaria.proxy.errors import ApiError


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool = True
    previous_response_id: str | None = None
    store: StrictBool = True
    stream: StrictBool = False
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class ParsedResponses:
    body: ResponsesRequest
    items: list[dict[str, Any]]
    """This request's own input items, with only the fields their type defines
    (responses_items.py), each given an ``id``."""


def parse_request(raw: Any, request_id: str) -> ParsedResponses:
    body = parse(ResponsesRequest, raw, status=400)
    if isinstance(body.input, str):
        items: list[dict[str, Any]] = [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": body.input}],
            }
        ]
    else:
        items = [stored_item(item) for item in body.input]
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


def tools_of(entries: list[dict[str, Any]] | None) -> tuple[ToolSpec, ...]:
    tools: list[ToolSpec] = []
    for i, entry in enumerate(entries or ()):
        if entry.get("type") == "namespace":  # Codex groups sub-agent tools this way
            group = entry.get("tools") or []
            if not isinstance(group, list) or not all(isinstance(t, dict) for t in group):
                raise invalid("A namespace's `tools` must be a list of tools.", f"tools.{i}")
            tools.extend(tools_of(group))
            continue
        spec = function_tool(entry, f"tools.{i}")
        if spec is not None:
            tools.append(spec)
    return tuple(tools)


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if fmt["type"] == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise invalid("text.format.schema must be a JSON schema object.", "text.format")
        return {
            "type": "json_schema",
            "json_schema": {"name": fmt.get("name", "output"), "schema": schema},
        }
    raise invalid('text.format.type must be "text", "json_object" or "json_schema".', "text.format")


def to_call(parsed: ParsedResponses, history: list[dict[str, Any]]) -> Call:
    body = parsed.body
    tools = tools_of(body.tools)
    effort = (body.reasoning or {}).get("effort")
    return Call(
        model=body.model,
        messages=messages_of(body.instructions, [*history, *parsed.items]),
        tools=tools,
        tool_choice=openai_tool_choice(body.tool_choice, tools, "tool_choice"),
        sampling=Sampling(
            temperature=body.temperature,
            top_p=body.top_p,
            logprobs=body.top_logprobs is not None,
            top_logprobs=body.top_logprobs,
            response_format=_response_format(body.text),
        ),
        max_output_tokens=body.max_output_tokens,
        stream=body.stream,
        reasoning_effort=effort if isinstance(effort, str) else None,
        parallel_tool_calls=body.parallel_tool_calls,
    )


# -- output ---------------------------------------------------------------------------------


def _ids(request_id: str) -> dict[str, str]:
    return {"message": f"msg_{request_id}", "reasoning": f"rs_{request_id}"}


def output_items(output: ModelOutput, request_id: str) -> list[dict[str, Any]]:
    ids = _ids(request_id)
    items: list[dict[str, Any]] = []
    if output.reasoning:
        items.append(_reasoning_item(ids["reasoning"], output.reasoning, "completed"))
    if output.text or not output.tool_calls:
        items.append(_message_item(ids["message"], output.text, "completed"))
    for i, call in enumerate(output.tool_calls):
        items.append(
            _call_item(f"fc_{request_id}_{i}", call.id, call.name, call.arguments, "completed")
        )
    return items


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if text else []
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def _message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": status,
        "content": content,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def usage(outcome: CallOutcome) -> dict[str, Any]:
    r = outcome.result
    return {
        "input_tokens": r.prompt_tokens,
        "input_tokens_details": {"cached_tokens": r.cached_tokens},
        "output_tokens": r.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},  # engines report no separate count
        "total_tokens": r.prompt_tokens + r.output_tokens,
    }


def response_object(
    parsed: ParsedResponses,
    request_id: str,
    created: float,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage_doc: dict[str, Any] | None,
    stored: bool,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body = parsed.body
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": f"resp_{request_id}",
        "object": "response",
        "created_at": created,
        "status": status,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": body.model,
        "output": output,
        "parallel_tool_calls": body.parallel_tool_calls,
        "previous_response_id": body.previous_response_id,
        "reasoning": body.reasoning or {"effort": None, "summary": None},
        "store": stored,
        "temperature": body.temperature,
        "text": body.text or {"format": {"type": "text"}},
        "tool_choice": body.tool_choice or "auto",
        "tools": list(body.tools or ()),
        "top_p": body.top_p,
        "truncation": "disabled",
        "usage": usage_doc,
        "user": body.user,
        "metadata": body.metadata or {},
        "prompt_cache_key": body.prompt_cache_key,
    }


def final_response(
    parsed: ParsedResponses, outcome: CallOutcome, request_id: str, created: float, stored: bool
) -> dict[str, Any]:
    status = "incomplete" if outcome.output.finish_reason == "length" else "completed"
    return response_object(
        parsed,
        request_id,
        created,
        status=status,
        output=output_items(outcome.output, request_id),
        usage_doc=usage(outcome),
        stored=stored,
    )


class _StreamItems:
    """Output items opened and closed as the deltas change kind, with the events of each."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.ids = _ids(request_id)
        self.sequence = 0
        self.index = -1
        self.kind: str | None = None
        self.tool: int | None = None
        self.item: dict[str, Any] = {}
        self.text = ""

    def event(self, kind: str, **data: Any) -> bytes:
        frame = sse({"type": kind, **data, "sequence_number": self.sequence}, kind)
        self.sequence += 1
        return frame

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.item["id"], "output_index": self.index}

    def open(self, kind: str, item: dict[str, Any], tool: int | None = None) -> list[bytes]:
        frames = self.close()
        self.index += 1
        self.kind, self.tool, self.item, self.text = kind, tool, item, ""
        frames.append(self.event("response.output_item.added", output_index=self.index, item=item))
        if kind == "reasoning":
            part = {"type": "reasoning_text", "text": ""}
            frames.append(
                self.event(
                    "response.content_part.added", **self._where(), content_index=0, part=part
                )
            )
        elif kind == "message":
            frames.append(
                self.event(
                    "response.content_part.added",
                    **self._where(),
                    content_index=0,
                    part=_text_part(""),
                )
            )
        return frames

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        where, frames = self._where(), []
        if self.kind == "reasoning":
            part = {"type": "reasoning_text", "text": self.text}
            frames.append(
                self.event("response.reasoning_text.done", **where, content_index=0, text=self.text)
            )
            frames.append(
                self.event("response.content_part.done", **where, content_index=0, part=part)
            )
            done = _reasoning_item(self.item["id"], self.text, "completed")
        elif self.kind == "message":
            frames.append(
                self.event(
                    "response.output_text.done",
                    **where,
                    content_index=0,
                    text=self.text,
                    logprobs=[],
                )
            )
            frames.append(
                self.event(
                    "response.content_part.done",
                    **where,
                    content_index=0,
                    part=_text_part(self.text),
                )
            )
            done = _message_item(self.item["id"], self.text, "completed")
        else:
            item = self.item
            frames.append(
                self.event(
                    "response.function_call_arguments.done",
                    **where,
                    arguments=self.text,
                    name=item["name"],
                )
            )
            done = _call_item(item["id"], item["call_id"], item["name"], self.text, "completed")
        frames.append(self.event("response.output_item.done", output_index=self.index, item=done))
        self.kind = None
        return frames

    def delta(self, delta: OutputDelta) -> list[bytes]:
        frames: list[bytes] = []
        if delta.reasoning:
            if self.kind != "reasoning":
                frames += self.open(
                    "reasoning", _reasoning_item(self.ids["reasoning"], "", "in_progress")
                )
            self.text += delta.reasoning
            frames.append(
                self.event(
                    "response.reasoning_text.delta",
                    **self._where(),
                    content_index=0,
                    delta=delta.reasoning,
                )
            )
        if delta.text:
            if self.kind != "message":
                frames += self.open(
                    "message", _message_item(self.ids["message"], None, "in_progress")
                )
            self.text += delta.text
            frames.append(
                self.event(
                    "response.output_text.delta",
                    **self._where(),
                    content_index=0,
                    delta=delta.text,
                    logprobs=[],
                )
            )
        for part in delta.tool_calls:
            if self.kind != "function_call" or self.tool != part.index:
                item = _call_item(
                    f"fc_{self.request_id}_{part.index}",
                    part.id or "",
                    part.name or "",
                    "",
                    "in_progress",
                )
                frames += self.open("function_call", item, part.index)
            if part.arguments:
                self.text += part.arguments
                frames.append(
                    self.event(
                        "response.function_call_arguments.delta",
                        **self._where(),
                        delta=part.arguments,
                    )
                )
        return frames


async def response_stream(
    handle: CallHandle, parsed: ParsedResponses, request_id: str, created: float, stored: bool
) -> AsyncIterator[bytes]:
    items = _StreamItems(request_id)
    start = response_object(
        parsed, request_id, created, status="in_progress", output=[], usage_doc=None, stored=stored
    )
    yield items.event("response.created", response=start)
    yield items.event("response.in_progress", response=start)
    async for event in output_events(handle):
        if isinstance(event, OutputDelta):
            for frame in items.delta(event):
                yield frame
        elif isinstance(event, CallOutcome):
            if items.index < 0:  # an empty reply is one empty message
                for frame in items.open(
                    "message", _message_item(items.ids["message"], None, "in_progress")
                ):
                    yield frame
            for frame in items.close():
                yield frame
            final = final_response(parsed, event, request_id, created, stored)
            kind = (
                "response.incomplete" if final["status"] == "incomplete" else "response.completed"
            )
            yield items.event(kind, response=final)
        elif isinstance(event, ApiError):
            for frame in items.close():
                yield frame
            error = {"code": event.code or "server_error", "message": event.message}
            failed = response_object(
                parsed, request_id, created, status="failed", output=[], usage_doc=None,
                stored=False, error=error,
            )  # fmt: skip
            yield items.event("response.failed", response=failed)
