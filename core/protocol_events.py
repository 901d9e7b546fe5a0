"""The proxy ↔ runtime protocol's events (core/protocol.py has the map of the documents and
the version rule): the NDJSON reply to a call, one event per line, and the deltas, outputs
and results they carry.

- **events**: ``{"type": "first", "t_s", "cached_tokens", "kv_source", "delta"}``,
  ``{"type": "delta", "t_s", "tokens", "delta"}``, ``{"type": "finished", "result"}`` or
  ``{"type": "error", "message", "code"?, "param"?}`` (``ErrorEvent``);
- a **delta** is ``{"text", "reasoning", "tool_calls": [{index, id, name, arguments}],
  "logprobs": [[token, logprob, [[token, logprob], ...]], ...]}`` (empty members omitted);
- a **result** holds ``output`` ``{text, reasoning, tool_calls: [{id, name, arguments}],
  finish_reason, logprobs}`` and ``engine`` ``{queued_s, scheduled_s, first_token_s,
  last_token_s}`` or null (``EngineTimes``; a peer that predates it sends none, and one that
  does not know it ignores it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from talaria.core.calls import ModelOutput, OutputDelta, TokenLogprob, ToolCall, ToolCallDelta
from talaria.core.protocol import ProtocolError
from talaria.core.types import (
    CallResult,
    EngineTimes,
    Finished,
    FirstToken,
    GenerationEvent,
    KvSource,
    TokenDelta,
)

_RESULT_FIELDS = {f.name for f in fields(CallResult)}
_ENGINE_FIELDS = {f.name for f in fields(EngineTimes)}


@dataclass(frozen=True)
class ErrorEvent:
    """The runtime failed the call: a runtime fault, or (with ``code``) the caller's fault."""

    message: str
    code: str | None = None
    param: str | None = None


# -- outputs and results --------------------------------------------------------------------


def _logprobs_to_list(logprobs: tuple[TokenLogprob, ...]) -> list[list[Any]]:
    return [[p.token, p.logprob, [list(t) for t in p.top]] for p in logprobs]


def _logprobs_from_list(data: Any) -> tuple[TokenLogprob, ...]:
    return tuple(
        TokenLogprob(token, logprob, tuple((t, lp) for t, lp in top))
        for token, logprob, top in data or ()
    )


def delta_to_dict(delta: OutputDelta) -> dict[str, Any]:
    """An output delta, empty members omitted."""
    data: dict[str, Any] = {}
    if delta.text:
        data["text"] = delta.text
    if delta.reasoning:
        data["reasoning"] = delta.reasoning
    if delta.tool_calls:
        data["tool_calls"] = [asdict(c) for c in delta.tool_calls]
    if delta.logprobs:
        data["logprobs"] = _logprobs_to_list(delta.logprobs)
    return data


def delta_from_dict(data: Mapping[str, Any]) -> OutputDelta:
    """The ``OutputDelta`` of a delta document."""
    return OutputDelta(
        text=data.get("text", ""),
        reasoning=data.get("reasoning", ""),
        tool_calls=tuple(ToolCallDelta(**c) for c in data.get("tool_calls", ())),
        logprobs=_logprobs_from_list(data.get("logprobs")),
    )


def output_to_dict(output: ModelOutput) -> dict[str, Any]:
    """A whole reply (``ModelOutput``)."""
    return {
        "text": output.text,
        "reasoning": output.reasoning,
        "tool_calls": [asdict(c) for c in output.tool_calls],
        "finish_reason": output.finish_reason,
        "logprobs": _logprobs_to_list(output.logprobs),
    }


def output_from_dict(data: Mapping[str, Any]) -> ModelOutput:
    """The ``ModelOutput`` of an output document."""
    return ModelOutput(
        text=data.get("text", ""),
        reasoning=data.get("reasoning", ""),
        tool_calls=tuple(ToolCall(**c) for c in data.get("tool_calls", ())),
        finish_reason=data.get("finish_reason", "stop"),
        logprobs=_logprobs_from_list(data.get("logprobs")),
    )


def result_to_dict(result: CallResult) -> dict[str, Any]:
    """``CallResult``'s fields, with its output and engine times as documents."""
    data = {f.name: getattr(result, f.name) for f in fields(CallResult)}
    data["kv_source"] = result.kv_source.value
    data["output"] = None if result.output is None else output_to_dict(result.output)
    data["engine"] = None if result.engine is None else asdict(result.engine)
    return data


def result_from_dict(data: Mapping[str, Any]) -> CallResult:
    """The ``CallResult`` of a result document (fields it does not know are ignored)."""
    known = {k: v for k, v in data.items() if k in _RESULT_FIELDS}
    known["kv_source"] = KvSource(known["kv_source"])
    output = known.get("output")
    known["output"] = None if output is None else output_from_dict(output)
    engine = known.get("engine")
    known["engine"] = (
        None
        if engine is None
        else EngineTimes(**{k: v for k, v in engine.items() if k in _ENGINE_FIELDS})
    )
    return CallResult(**known)


# -- events ---------------------------------------------------------------------------------


def event_to_dict(event: GenerationEvent | ErrorEvent) -> dict[str, Any]:
    """One line of the NDJSON event stream."""
    if isinstance(event, FirstToken):
        return {
            "type": "first",
            "t_s": event.t_s,
            "cached_tokens": event.cached_tokens,
            "kv_source": event.kv_source.value,
            "delta": None if event.delta is None else delta_to_dict(event.delta),
        }
    if isinstance(event, TokenDelta):
        return {
            "type": "delta",
            "t_s": event.t_s,
            "tokens": event.tokens,
            "delta": None if event.delta is None else delta_to_dict(event.delta),
        }
    if isinstance(event, Finished):
        return {"type": "finished", "result": result_to_dict(event.result)}
    data: dict[str, Any] = {"type": "error", "message": event.message}
    if event.code is not None:
        data["code"] = event.code
        data["param"] = event.param
    return data


def event_from_dict(data: Mapping[str, Any]) -> GenerationEvent | ErrorEvent:
    """The event of one NDJSON line (``ProtocolError`` if it is malformed)."""
    kind = data.get("type")
    try:
        if kind == "first":
            delta = data.get("delta")
            return FirstToken(
                data["t_s"],
                data["cached_tokens"],
                KvSource(data["kv_source"]),
                None if delta is None else delta_from_dict(delta),
            )
        if kind == "delta":
            delta = data.get("delta")
            return TokenDelta(
                data["t_s"], data["tokens"], None if delta is None else delta_from_dict(delta)
            )
        if kind == "finished":
            return Finished(result_from_dict(data["result"]))
        if kind == "error":
            code = data.get("code")
            return ErrorEvent(
                str(data.get("message", "")),
                code if isinstance(code, str) else None,
                data.get("param") if isinstance(code, str) else None,
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"bad {kind} event: {exc!r}") from exc
    raise ProtocolError(f"unexpected event {dict(data)!r}")
