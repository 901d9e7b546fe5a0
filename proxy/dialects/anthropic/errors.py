"""Anthropic's error envelope: ``{"type": "error", "error": {"type", "message"}}``, with its
error types and statuses (a validation failure is a 400, an overloaded service a 529), and
the ``error`` event that ends a stream."""

from __future__ import annotations

from typing import Any

from talaria.proxy.contract.errors import ApiError
from talaria.proxy.dialects.common import sse

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}
STATUS = {422: 400, 503: 529}
"""Anthropic reports validation failures as 400 and an overloaded service as 529."""


def error_body(error: ApiError) -> tuple[int, dict[str, Any]]:
    """(status, body) of an error in Anthropic's envelope."""
    status = STATUS.get(error.status, error.status)
    kind = ERROR_TYPES.get(
        error.status, "api_error" if error.status >= 500 else "invalid_request_error"
    )
    return status, {"type": "error", "error": {"type": kind, "message": error.message}}


def stream_error(error: ApiError) -> bytes:
    """``error`` as the ``error`` event that ends a stream."""
    return sse(error_body(error)[1], "error")
