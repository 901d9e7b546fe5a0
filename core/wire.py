"""JSON forms of the types that cross the proxy ↔ runtime HTTP seam."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from talaria.core.types import CallRequest, CallResult, KvSource

_REQUEST_FIELDS = {f.name for f in fields(CallRequest)}
_RESULT_FIELDS = {f.name for f in fields(CallResult)}


class WireError(ValueError):
    """A message on the seam is malformed."""


def request_to_dict(request: CallRequest) -> dict[str, Any]:
    data = asdict(request)
    if request.messages is not None:
        data["messages"] = list(request.messages)
    return data


def request_from_dict(data: Any) -> CallRequest:
    if not isinstance(data, dict):
        raise WireError("a call request must be a JSON object")
    unknown = set(data) - _REQUEST_FIELDS
    if unknown:
        raise WireError(f"unknown call request fields: {sorted(unknown)}")
    try:
        request = CallRequest(**data)
    except TypeError as exc:
        raise WireError(f"bad call request: {exc}") from exc
    if request.messages is not None:
        request = CallRequest(**{**data, "messages": tuple(request.messages)})
    if request.prompt_tokens < 1 or request.max_output_tokens < 1:
        raise WireError("prompt_tokens and max_output_tokens must be positive")
    return request


def result_to_dict(result: CallResult) -> dict[str, Any]:
    data = asdict(result)
    data["kv_source"] = result.kv_source.value
    return data


def result_from_dict(data: dict[str, Any]) -> CallResult:
    known = {k: v for k, v in data.items() if k in _RESULT_FIELDS}
    known["kv_source"] = KvSource(known["kv_source"])
    return CallResult(**known)
