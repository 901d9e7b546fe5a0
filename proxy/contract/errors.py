"""Errors in OpenAI's envelope: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
from typing import Any


class ApiError(Exception):
    """An error the API reports to the caller with ``status`` and OpenAI's envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        """The error in OpenAI's envelope (the JSON body of the response)."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        """``Retry-After`` in whole seconds (at least 1) when ``retry_after_s`` is set, else
        none."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}

    def sse(self) -> bytes:
        """The error as one SSE data frame (errors during a stream)."""
        return b"data: " + json.dumps(self.body()).encode() + b"\n\n"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 ``invalid_request_error``."""
    return ApiError(400, message, param=param, code=code)


def unknown_model(model: str, known: list[str]) -> ApiError:
    """A 404 ``model_not_found`` that lists the ``known`` models."""
    return ApiError(
        404,
        f"The model `{model}` does not exist or you do not have access to it. "
        f"Available: {', '.join(known)}",
        code="model_not_found",
        param="model",
    )


def unauthorized(message: str = "Invalid or missing API key.") -> ApiError:
    """A 401 ``invalid_api_key``."""
    return ApiError(401, message, type="authentication_error", code="invalid_api_key")


def too_many_requests(limit: int) -> ApiError:
    """A 429 for a key with ``limit`` calls in flight already (``Retry-After: 1``)."""
    return ApiError(
        429,
        f"Too many requests in flight for this key (limit {limit}). Retry shortly.",
        type="rate_limit_error",
        code="rate_limit_exceeded",
        retry_after_s=1.0,
    )


def rate_limited(
    limit: str, value: int, retry_after_s: float, reservation: tuple[int, int] | None = None
) -> ApiError:
    """A 429 for a key past one of its per-minute limits (``limit``: ``requests`` or
    ``tokens``), ``Retry-After`` when its minute ends (proxy/callpath/limiter.py);
    ``reservation``: the tokens the call would reserve and those left of the limit."""
    detail = ""
    if reservation is not None:
        reserved, left = reservation
        detail = (
            f" This call reserves {reserved} tokens (its prompt and its output limit); "
            f"{left} are left this minute (a lower max_tokens reserves fewer)."
        )
    return ApiError(
        429,
        f"Rate limit reached for this key: {value} {limit} per minute.{detail} Retry when "
        "the minute ends (Retry-After).",
        type="rate_limit_error",
        code="rate_limit_exceeded",
        retry_after_s=retry_after_s,
    )


def too_many_sessions(limit: int, retry_after_s: float) -> ApiError:
    """A call that would open a session past the tenant's live sessions (continuations of
    live sessions are never refused)."""
    return ApiError(
        429,
        f"Too many live sessions and conversations for this key (limit {limit}); continue "
        "or end one (POST /v1/sessions/{id}/end), or retry once one has ended.",
        type="rate_limit_error",
        code="too_many_sessions",
        retry_after_s=retry_after_s,
    )


def too_many_threads(limit: int) -> ApiError:
    """A call that would open one more conversation of a session whose ``limit`` threads all
    have a call in flight (proxy/sessions/book.py)."""
    return ApiError(
        429,
        f"This session has {limit} conversations with a call in flight (the limit); retry "
        "once one of them has its reply.",
        type="rate_limit_error",
        code="too_many_threads",
        retry_after_s=1.0,
    )


def unavailable(message: str, retry_after_s: float = 1.0) -> ApiError:
    """A 503 ``runtime_unavailable`` with ``Retry-After``."""
    return ApiError(
        503, message, type="server_error", code="runtime_unavailable", retry_after_s=retry_after_s
    )
