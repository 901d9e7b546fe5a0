"""The proxy ↔ runtime protocol, defined once: JSON documents for a call, its events, and a
node's status, with their encoders and decoders side by side. Both ends import these modules
and nothing of each other. This one holds what every document shares: the version rule, the
error, and the runtime's token.

Documents (every top-level document carries ``"v": PROTOCOL_VERSION``), each with its codec:

- **request** (``POST /v1/runtime/generate`` body) and the **call** in it:
  core/protocol_calls.py;
- **events** (the NDJSON reply, one per line), with the deltas and the result they carry:
  core/protocol_events.py;
- **status** (``GET /v1/runtime/status``): core/protocol_status.py;
- **session control** (hints, ends, moves; the ends document): core/protocol_sessions.py.

A peer speaking another version is refused with a clear error (``ProtocolError``) rather than
misread.

**Authentication.** A runtime started with a token (``RUNTIME_TOKEN_ENV``) answers every
request but ``GET /healthz`` and ``GET /readyz`` with 401 unless it carries
``Authorization: Bearer <token>`` (runtime/auth.py); the proxy sends it on every request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PROTOCOL_VERSION = 9
"""1: token counts only (text in ``output_text``); 2: the normalized call (tools, tool choice,
sampling) and structured output deltas; 3: reasoning effort, template kwargs, parallel tool
calls, strict tools, logprobs; 4: the call's content as one nested ``call`` document (``Call``'s
fields) instead of top-level fields of the request; 5: the session's key as ``session_key`` (was
``session_id``) in the request and the result (``session_id`` is the client's id, which the
runtime never sees); 6: the call's tenant (an opaque key) and its weight, priority and
deadline; 7: a sub-agent's parent (``parent_session_key``, ``parent_prefix_tokens``); 8: the
agent's kind (``agent``); 9: each model's gap-model quality in the status
(``gap_models``)."""

RUNTIME_TOKEN_ENV = "TALARIA_RUNTIME_TOKEN"
"""The environment variable holding the runtime's bearer token, on both ends."""
MIN_RUNTIME_TOKEN_CHARS = 16
"""A shorter runtime token is refused at start, on both ends (as ``TALARIA_ADMIN_TOKEN``)."""


class ProtocolError(ValueError):
    """A document on the seam is malformed, or speaks another protocol version."""


def check_version(data: Mapping[str, Any], what: str) -> None:
    """``ProtocolError`` unless ``data`` (from ``what``) speaks ``PROTOCOL_VERSION``."""
    version = data.get("v")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"{what} speaks protocol version {version!r}; this side speaks {PROTOCOL_VERSION}"
        )
