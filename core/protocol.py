"""The proxy ↔ runtime protocol, defined once: JSON documents for a call, its events, and a
node's status, with their encoders and decoders side by side. Both ends import this module and
nothing of each other.

Documents (every top-level document carries ``"v": PROTOCOL_VERSION``):

- **request** (``POST /v1/runtime/generate`` body): ``CallRequest``'s scheduling fields and
  ``call``: null (a replayed trace entry) or the **call** document, ``Call``'s fields, with
  ``tools`` as ``[{name, description, parameters, strict}]``, ``tool_choice`` as
  ``{mode, name}`` and ``sampling`` as ``Sampling``'s fields (``stop`` a list);
- **events** (the NDJSON reply, one per line): ``{"type": "first", "t_s", "cached_tokens",
  "kv_source", "delta"}``, ``{"type": "delta", "t_s", "tokens", "delta"}``,
  ``{"type": "finished", "result"}`` or ``{"type": "error", "message", "code"?, "param"?}``;
  a delta is ``{"text", "reasoning", "tool_calls": [{index, id, name, arguments}],
  "logprobs": [[token, logprob, [[token, logprob], ...]], ...]}`` (empty members omitted) and
  a result holds ``output`` ``{text, reasoning, tool_calls: [{id, name, arguments}],
  finish_reason, logprobs}`` and ``engine`` ``{queued_s, scheduled_s, first_token_s,
  last_token_s}`` or null (``EngineTimes``; a peer that predates it sends none, and one that
  does not know it ignores it);
- **status** (``GET /v1/runtime/status``): ``InstanceStatus``'s fields plus the node's
  ``model_names``, recent ``slots`` and per-model ``engines`` info; never NaN nor Infinity
  (an entry holding one is left out, core/status.py ``status_json``; a reader leaves out only
  such an entry, ``lenient_status``, and one that does not decode, ``status_from_dict``).
- **session control** (hints, ends, moves; the ends document): core/protocol_sessions.py.

A peer speaking another version is refused with a clear error (``ProtocolError``) rather than
misread.

**Authentication.** A runtime started with a token (``RUNTIME_TOKEN_ENV``) answers every
request but ``GET /healthz`` and ``GET /readyz`` with 401 unless it carries
``Authorization: Bearer <token>`` (runtime/auth.py); the proxy sends it on every request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from talaria.core.calls import (
    Call,
    ModelOutput,
    OutputDelta,
    Sampling,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolSpec,
)
from talaria.core.status import InstanceStatus
from talaria.core.types import (
    CallRequest,
    CallResult,
    EngineTimes,
    Finished,
    FirstToken,
    GenerationEvent,
    KvSource,
    Priority,
    TokenDelta,
)

PROTOCOL_VERSION = 9
"""1: token counts only (text in ``output_text``); 2: the normalized call (tools, tool choice,
sampling) and structured output deltas; 3: reasoning effort, template kwargs, parallel tool
calls, strict tools, logprobs; 4: the call's content as one nested ``call`` document (``Call``'s
fields) instead of top-level fields of the request; 5: the session's key as ``session_key`` (was
``session_id``) in the request and the result (``session_id`` is the client's id, which the
runtime never sees); 6: the call's tenant (an opaque key) and its weight, priority and
deadline; 7: a sub-agent's parent (``parent_session_key``, ``parent_prefix_tokens``); 8: the
agent's kind (``agent``)."""
MAX_TENANT_WEIGHT = 100.0
"""A tenant's share weight is in (0, ``MAX_TENANT_WEIGHT``]."""
MAX_AGENT_CHARS = 64
"""A call's ``agent`` is at most this many characters (the proxy sends at most 40)."""

RUNTIME_TOKEN_ENV = "TALARIA_RUNTIME_TOKEN"
"""The environment variable holding the runtime's bearer token, on both ends."""
MIN_RUNTIME_TOKEN_CHARS = 16
"""A shorter runtime token is refused at start, on both ends (as ``TALARIA_ADMIN_TOKEN``)."""

_REQUEST_FIELDS = {f.name for f in fields(CallRequest)}
_CALL_FIELDS = {f.name for f in fields(Call)}
_RESULT_FIELDS = {f.name for f in fields(CallResult)}
_ENGINE_FIELDS = {f.name for f in fields(EngineTimes)}
_SAMPLING_FIELDS = {f.name for f in fields(Sampling)}
STATUS_EXTRA_KEYS = (
    "v",
    "model_names",
    "slots",
    "engines",
    "draining_models",
    "weight_budget_bytes",
    "quantum_s",
    "server",
    "gpus",
)
"""Status document keys beyond ``InstanceStatus``'s fields."""


class ProtocolError(ValueError):
    """A document on the seam is malformed, or speaks another protocol version."""


@dataclass(frozen=True)
class ErrorEvent:
    """The runtime failed the call: a runtime fault, or (with ``code``) the caller's fault."""

    message: str
    code: str | None = None
    param: str | None = None


def check_version(data: Mapping[str, Any], what: str) -> None:
    """``ProtocolError`` unless ``data`` (from ``what``) speaks ``PROTOCOL_VERSION``."""
    version = data.get("v")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"{what} speaks protocol version {version!r}; this side speaks {PROTOCOL_VERSION}"
        )


# -- calls ----------------------------------------------------------------------------------


def call_to_dict(call: Call) -> dict[str, Any]:
    """The call document: ``Call``'s fields, with tools, tool choice and sampling as dicts."""
    data: dict[str, Any] = {f.name: getattr(call, f.name) for f in fields(Call)}
    if call.messages is not None:
        data["messages"] = list(call.messages)
    data["tools"] = [
        {
            "name": t.name,
            "description": t.description,
            "parameters": dict(t.parameters),
            "strict": t.strict,
        }
        for t in call.tools
    ]
    if call.template_kwargs is not None:
        data["template_kwargs"] = dict(call.template_kwargs)
    data["tool_choice"] = {"mode": call.tool_choice.mode, "name": call.tool_choice.name}
    sampling = asdict(call.sampling)
    sampling["stop"] = list(call.sampling.stop)
    data["sampling"] = sampling
    return data


def call_from_dict(data: Any) -> Call:
    """The ``Call`` of a call document (``ProtocolError`` if it is malformed)."""
    if not isinstance(data, dict):
        raise ProtocolError("a call must be a JSON object")
    body = dict(data)
    unknown = set(body) - _CALL_FIELDS
    if unknown:
        raise ProtocolError(f"unknown call fields: {sorted(unknown)}")
    try:
        if body.get("messages") is not None:
            body["messages"] = tuple(body["messages"])
        body["tools"] = tuple(ToolSpec(**t) for t in body.get("tools") or ())
        body["tool_choice"] = ToolChoice(**(body.get("tool_choice") or {}))
        sampling = dict(body.get("sampling") or {})
        if set(sampling) - _SAMPLING_FIELDS:
            raise ProtocolError(
                f"unknown sampling fields: {sorted(set(sampling) - _SAMPLING_FIELDS)}"
            )
        sampling["stop"] = tuple(sampling.get("stop") or ())
        body["sampling"] = Sampling(**sampling)
        return Call(**body)
    except TypeError as exc:
        raise ProtocolError(f"bad call request: {exc}") from exc


def request_to_dict(request: CallRequest) -> dict[str, Any]:
    """The request document: ``CallRequest``'s fields, its ``call`` a call document or null."""
    data: dict[str, Any] = {f.name: getattr(request, f.name) for f in fields(CallRequest)}
    data["v"] = PROTOCOL_VERSION
    data["call"] = None if request.call is None else call_to_dict(request.call)
    return data


def request_from_dict(data: Any) -> CallRequest:
    """The ``CallRequest`` of a request document (``ProtocolError`` if it is malformed or
    speaks another version)."""
    if not isinstance(data, dict):
        raise ProtocolError("a call request must be a JSON object")
    check_version(data, "the call")
    body = {k: v for k, v in data.items() if k != "v"}
    unknown = set(body) - _REQUEST_FIELDS
    if unknown:
        raise ProtocolError(f"unknown call request fields: {sorted(unknown)}")
    if body.get("call") is not None:
        body["call"] = call_from_dict(body["call"])
    try:
        request = CallRequest(**body)
    except TypeError as exc:
        raise ProtocolError(f"bad call request: {exc}") from exc
    if request.prompt_tokens < 1 or request.max_output_tokens < 1:
        raise ProtocolError("prompt_tokens and max_output_tokens must be positive")
    try:
        priority = Priority(request.priority)
    except ValueError as exc:
        raise ProtocolError(f"bad call request: unknown priority {request.priority!r}") from exc
    weight, deadline = request.tenant_weight, request.deadline_s
    if not isinstance(weight, int | float) or not 0 < weight <= MAX_TENANT_WEIGHT:
        raise ProtocolError(f"bad call request: tenant_weight must be in (0, {MAX_TENANT_WEIGHT}]")
    if deadline is not None and not (isinstance(deadline, int | float) and deadline >= 0):
        raise ProtocolError("bad call request: deadline_s must be a non-negative number")
    parent, shared = request.parent_session_key, request.parent_prefix_tokens
    if parent is not None and not isinstance(parent, str):
        raise ProtocolError("bad call request: parent_session_key must be a string or null")
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise ProtocolError("bad call request: parent_prefix_tokens must be an integer >= 0")
    if not isinstance(request.agent, str) or len(request.agent) > MAX_AGENT_CHARS:
        raise ProtocolError(
            f"bad call request: agent must be a string of at most {MAX_AGENT_CHARS} characters"
        )
    return replace(request, priority=priority)


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


# -- node status ----------------------------------------------------------------------------


def status_to_dict(status: InstanceStatus, **extra: Any) -> dict[str, Any]:
    """The status document: ``status`` plus the node's extras (``STATUS_EXTRA_KEYS``)."""
    return {**status.to_dict(), **extra, "v": PROTOCOL_VERSION}


def status_from_dict(data: Mapping[str, Any], dropped: list[str] | None = None) -> InstanceStatus:
    """The ``InstanceStatus`` of a status document; an entry that does not decode is left out,
    named in ``dropped`` (core/status.py); ``ProtocolError`` for another version or worse."""
    check_version(data, "the runtime")
    body = {k: v for k, v in data.items() if k not in STATUS_EXTRA_KEYS}
    try:
        return InstanceStatus.from_dict(body, dropped)
    except (TypeError, ValueError, KeyError) as exc:
        raise ProtocolError(f"bad status document: {exc!r}") from exc
