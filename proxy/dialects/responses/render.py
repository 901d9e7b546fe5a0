"""OpenAI Responses' output.

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

from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from talaria.core.calls import ModelOutput, OutputDelta
from talaria.proxy.contract.calls import CallHandle, CallOutcome
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.dialects.common import output_events, sse
from talaria.proxy.dialects.responses.parse import ParsedResponses


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


def _echo(value: Any) -> Any:
    """A request field as the client sent it (a model: its fields set, and its extras)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True, by_alias=True)
    return value


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
        "reasoning": _echo(body.reasoning) or {"effort": None, "summary": None},
        "store": stored,
        "temperature": body.temperature,
        "text": _echo(body.text) or {"format": {"type": "text"}},
        "tool_choice": _echo(body.tool_choice) or "auto",
        "tools": [_echo(t) for t in body.tools or ()],
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


def stream_error(error: ApiError) -> bytes:
    """``error`` as the Responses API's ``error`` event that ends a stream."""
    doc = {"type": "error", "code": error.code, "message": error.message, "param": None}
    return sse(doc, "error")
