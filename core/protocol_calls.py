"""The proxy ↔ runtime protocol's call (core/protocol.py has the map of the documents and the
version rule): the request document of ``POST /v1/runtime/generate`` and the call in it.

- **request**: ``CallRequest``'s scheduling fields and ``call``: null (a replayed trace entry)
  or the **call** document, ``Call``'s fields, with ``tools`` as ``[{name, description,
  parameters, strict}]``, ``tool_choice`` as ``{mode, name}`` and ``sampling`` as
  ``Sampling``'s fields (``stop`` a list).
"""

from __future__ import annotations

from dataclasses import asdict, fields, replace
from typing import Any

from talaria.core.calls import Call, Sampling, ToolChoice, ToolSpec
from talaria.core.protocol import PROTOCOL_VERSION, ProtocolError, check_version
from talaria.core.types import CallRequest, Priority

MAX_TENANT_WEIGHT = 100.0
"""A tenant's share weight is in (0, ``MAX_TENANT_WEIGHT``]."""
MAX_AGENT_CHARS = 64
"""A call's ``agent`` is at most this many characters (the proxy sends at most 40)."""

_REQUEST_FIELDS = {f.name for f in fields(CallRequest)}
_CALL_FIELDS = {f.name for f in fields(Call)}
_SAMPLING_FIELDS = {f.name for f in fields(Sampling)}


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
