"""Session identity from a request, and the gateway's in-memory state of each live session.

Identity, first match wins: header ``X-Talaria-Session-Id``, ``x-session-id``,
``x-litellm-session-id``, body ``litellm_session_id``, body ``prompt_cache_key``; a call with
none is a session of its own (one call, final). Hints: ``X-Talaria-Tool-Gap-Ms`` (tool time
expected after this call), ``X-Talaria-Session-Final: true``, ``X-Talaria-Parent-Session-Id``.

Prefix sharing: each message is fingerprinted (role, text, tool calls, tool_call_id) with its
token estimate; the tokens of the longest common prefix between this call's messages and the
previous call's messages + reply are what a prefix cache can reuse. The runtime gets that
count (``shared_prefix_tokens``), so a rewritten history is never counted as cached.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from talaria.core.reservations import GapEstimator
from talaria.proxy.synthetic import MESSAGE_OVERHEAD_TOKENS, content_text, estimate_tokens

SESSION_HEADERS = ("x-talaria-session-id", "x-session-id", "x-litellm-session-id")
SESSION_BODY_FIELDS = ("litellm_session_id", "prompt_cache_key")
MAX_SESSION_ID_CHARS = 200


class IdentityError(ValueError):
    """A session header or hint is malformed."""


@dataclass(frozen=True)
class Identity:
    session_id: str
    explicit: bool
    parent_session_id: str | None = None
    tool_gap_hint_s: float | None = None
    final: bool = False


def identify(headers: Mapping[str, str], body: Mapping[str, Any]) -> Identity:
    session_id: str | None = None
    for name in SESSION_HEADERS:
        if headers.get(name):
            session_id = headers[name].strip()
            break
    if session_id is None:
        for key in SESSION_BODY_FIELDS:
            value = body.get(key)
            if isinstance(value, str) and value.strip():
                session_id = value.strip()
                break
    if session_id is not None and len(session_id) > MAX_SESSION_ID_CHARS:
        raise IdentityError(f"session id longer than {MAX_SESSION_ID_CHARS} characters")
    gap_header = headers.get("x-talaria-tool-gap-ms")
    gap_s: float | None = None
    if gap_header:
        try:
            gap_s = float(gap_header) / 1000.0
        except ValueError as exc:
            raise IdentityError("X-Talaria-Tool-Gap-Ms must be a number of milliseconds") from exc
        if gap_s < 0:
            raise IdentityError("X-Talaria-Tool-Gap-Ms must not be negative")
    final = headers.get("x-talaria-session-final", "").strip().lower() in ("true", "1", "yes")
    parent = headers.get("x-talaria-parent-session-id") or None
    if session_id is None:
        return Identity(f"anon-{uuid.uuid4().hex}", False, parent, gap_s, True)
    return Identity(session_id, True, parent, gap_s, final)


Fingerprint = tuple[str, int]


def message_fingerprint(message: Mapping[str, Any]) -> Fingerprint:
    """(digest of role + text + tool calls + tool_call_id, estimated tokens)."""
    text = content_text(message.get("content"))
    calls = [
        ((c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments"))
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    canonical = json.dumps(
        [message.get("role"), text, calls, message.get("tool_call_id")], separators=(",", ":")
    )
    digest = hashlib.blake2b(canonical.encode(), digest_size=12).hexdigest()
    tokens = estimate_tokens(text) + estimate_tokens(json.dumps(calls)) * bool(calls)
    return digest, tokens + MESSAGE_OVERHEAD_TOKENS


def shared_prefix_tokens(previous: Sequence[Fingerprint], current: Sequence[Fingerprint]) -> int:
    shared = 0
    for old, new in zip(previous, current, strict=False):
        if old[0] != new[0]:
            break
        shared += new[1]
    return shared


@dataclass
class SessionState:
    session_id: str
    tenant_id: str
    model: str
    started_at: datetime
    parent_session_id: str | None = None
    calls: int = 0
    inflight: int = 0
    last_finish_s: float | None = None
    last_instance: str | None = None
    gaps: GapEstimator = field(default_factory=GapEstimator)
    history: list[Fingerprint] = field(default_factory=list)
    started_s: float = 0.0  # clock time of the first call (for SCT)
    reservation_id: str | None = None
    reserved_instance: str | None = None
    reservation_expires_s: float | None = None
    reservation_times: tuple[datetime, datetime, datetime] | None = None
    """(created, expected return, expires) wall times of the live reservation."""
    ended: bool = False


class SessionTable:
    """Live sessions, least recently used evicted beyond ``capacity`` (their records are in the
    store; an evicted session that calls again starts a fresh in-memory state)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = capacity
        self._items: OrderedDict[str, SessionState] = OrderedDict()

    def get(self, session_id: str) -> SessionState | None:
        state = self._items.get(session_id)
        if state is not None:
            self._items.move_to_end(session_id)
        return state

    def put(self, state: SessionState) -> None:
        self._items[state.session_id] = state
        self._items.move_to_end(state.session_id)
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)

    def pop(self, session_id: str) -> SessionState | None:
        return self._items.pop(session_id, None)

    def values(self) -> list[SessionState]:
        return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)
