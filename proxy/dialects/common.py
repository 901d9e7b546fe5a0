"""What the dialects share: request validation, a call's output as a stream of deltas, SSE
framing, and OpenAI-style tool and sampling fields (chat and Responses read them alike)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from talaria.core.calls import OutputDelta, ToolChoice, ToolSpec
from talaria.proxy.calls import CallHandle, CallOutcome
from talaria.proxy.errors import ApiError

M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], data: Any, status: int = 422) -> M:
    """Validate ``data``; a failure becomes an ``ApiError`` (``status``) naming the field."""
    if not isinstance(data, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_value")
    _check_text(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise ApiError(
            status, f"Invalid request: {param}: {first['msg']}", param=param, code="invalid_value"
        ) from exc


def _check_text(data: Any) -> None:
    """400 when a string of the body is not Unicode text: JSON's ``\\ud800`` escapes decode to
    lone surrogates, which no UTF-8 encoder (token estimates, the store) takes."""
    try:
        json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        raise ApiError(
            400,
            f"The request body holds a string that is not Unicode text: {exc.reason} "
            f"({exc.object[exc.start : exc.end]!r}).",
            code="invalid_value",
        ) from exc
    except RecursionError as exc:
        raise ApiError(
            400, "The request body nests too deeply to be read.", code="invalid_value"
        ) from exc


def invalid(message: str, param: str) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value")


async def output_events(handle: CallHandle) -> AsyncIterator[OutputDelta | CallOutcome | ApiError]:
    """The call's output as the engine streamed it: ``OutputDelta``s, then the ``CallOutcome``
    (or an ``ApiError``). An engine that streamed nothing has its whole output handed out as
    deltas just before the outcome, so every renderer sees the same sequence."""
    seen = False
    while True:
        kind, value = await handle.events.get()
        if kind in ("first", "delta"):
            if value is not None and not value.empty:
                seen = True
                yield value
        elif kind == "done":
            outcome: CallOutcome = value
            if not seen:
                for delta in outcome.output.deltas():
                    yield delta
            yield outcome
            return
        elif kind == "error":
            yield value
            return


def sse(data: Mapping[str, Any], event: str | None = None) -> bytes:
    """One SSE frame (``event:`` line when named)."""
    body = b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
    return (b"event: " + event.encode() + b"\n" + body) if event else body


def function_tool(entry: Mapping[str, Any], param: str) -> ToolSpec | None:
    """An OpenAI function tool (chat's ``{"type", "function": {...}}`` or Responses' flat
    ``{"type", "name", ...}``) as a ``ToolSpec``; None for other tool types (built-in tools
    such as web search, which no self-hosted engine runs)."""
    if entry.get("type", "function") != "function":
        return None
    function = entry.get("function", entry)
    if not isinstance(function, Mapping):
        raise invalid("A function tool needs a `function` object.", param)
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise invalid("A function tool needs a `name`.", param)
    parameters = function.get("parameters") or {}
    if not isinstance(parameters, Mapping):
        raise invalid("`parameters` must be a JSON schema object.", param)
    description = function.get("description") or ""
    strict = function.get("strict")
    return ToolSpec(
        name, str(description), dict(parameters), strict if isinstance(strict, bool) else None
    )


def openai_tool_choice(value: Any, tools: tuple[ToolSpec, ...], param: str) -> ToolChoice:
    """``"auto" | "none" | "required"`` or a named function (chat's ``{"type": "function",
    "function": {"name"}}`` or Responses' ``{"type": "function", "name"}``)."""
    if value is None or value == "auto":
        return ToolChoice("auto")
    if value in ("none", "required"):
        return ToolChoice(value)
    if isinstance(value, Mapping) and value.get("type") == "function":
        function = value.get("function", value)
        name = function.get("name") if isinstance(function, Mapping) else None
        if isinstance(name, str) and name:
            if name not in {t.name for t in tools}:
                raise invalid(f"tool_choice names `{name}`, which is not among the tools.", param)
            return ToolChoice("named", name)
    raise invalid(
        'tool_choice must be "auto", "none", "required" or '
        '{"type": "function", "function": {"name": ...}}.',
        param,
    )
