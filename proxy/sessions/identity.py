"""Session identity from a request's headers and body, without any help from the client.

Explicit ids, first match wins (docs/proxy.md has this as a table, docs/agents.md what each
agent sends):

- Talaria: header ``X-Talaria-Session-Id``;
- Claude Code: header ``X-Claude-Code-Session-Id``; else body ``metadata.user_id``, a JSON
  string with ``session_id`` (current versions) or ``user_<hash>_account_<uuid>_session_<uuid>``
  (older ones);
- Codex CLI: header ``session-id``, else ``thread-id``;
- OpenAI: body ``prompt_cache_key``;
- aliases: header ``x-session-id``, header ``x-litellm-session-id``, body
  ``litellm_session_id``.

With none, the call is *implicit*: the session book finds the session whose conversation it
extends (book.py). Every id is validated the same way wherever it came from: 1 to 200
printable ASCII characters (no control characters), so it is safe to echo in a header.

Hints: ``X-Talaria-Tool-Gap-Ms`` (tool time expected after this call; finite, 0 to
``MAX_TOOL_GAP_S``), ``X-Talaria-Session-Final: true``, ``X-Talaria-Parent-Session-Id``
(validated like an id).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_SESSION_ID_CHARS = 200
MAX_TOOL_GAP_S = 24 * 3600.0
"""A tool gap hint beyond a day is refused (no reservation should outlive that)."""
_VALID_ID = re.compile(rf"[\x20-\x7e]{{1,{MAX_SESSION_ID_CHARS}}}")
_LEGACY_CLAUDE = re.compile(r"_session_([0-9a-fA-F-]{8,64})$")


class IdentityError(ValueError):
    """A session id or hint is malformed; ``field`` names where it came from."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Identity:
    """What a request says about its session. ``session_id`` is the client's id (or a key the
    proxy sent back, which the book also accepts), never looked up here; None: implicit."""

    session_id: str | None
    source: str
    """Where the id came from ("talaria", "claude-code", "codex", "prompt_cache_key",
    "x-session-id", "x-litellm-session-id", "litellm_session_id"), or "implicit"."""
    parent_session_id: str | None = None
    """The parent's id as the client gave it (``X-Talaria-Parent-Session-Id``)."""
    tool_gap_hint_s: float | None = None
    """Tool time expected after this call, seconds (the header is in milliseconds)."""
    final: bool = False

    @property
    def explicit(self) -> bool:
        """The request named its session (``session_id`` is not None)."""
        return self.session_id is not None


def valid_id(value: str, field: str) -> str:
    """``value`` stripped, or ``IdentityError`` if it is not 1–200 printable ASCII characters."""
    stripped = value.strip()
    if not _VALID_ID.fullmatch(stripped):
        raise IdentityError(
            f"{field} must be 1 to {MAX_SESSION_ID_CHARS} printable ASCII characters", field
        )
    return stripped


def claude_code_session(metadata: Any) -> str | None:
    """The session id inside Claude Code's ``metadata.user_id``, if any."""
    if not isinstance(metadata, Mapping):
        return None
    user_id = metadata.get("user_id")
    if not isinstance(user_id, str) or not user_id:
        return None
    if user_id.startswith("{"):
        try:
            parsed = json.loads(user_id)
        except (ValueError, RecursionError):  # not JSON, or nested too deep to read
            return None
        found = parsed.get("session_id") if isinstance(parsed, dict) else None
        return found if isinstance(found, str) and found else None
    legacy = _LEGACY_CLAUDE.search(user_id)
    return legacy.group(1) if legacy else None


OUTRANKING_HEADERS = ("x-talaria-session-id", "x-claude-code-session-id")
"""The headers ranked above every body field (the first two rows of ``_explicit``)."""


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    return value if value and value.strip() else None


def named_by_header(headers: Mapping[str, str]) -> bool:
    """Whether a header that outranks every body field names the session: then
    ``identify(headers, body)`` is ``identify(headers, {})``, known before the body is read."""
    return any(_header(headers, name) is not None for name in OUTRANKING_HEADERS)


def _explicit(headers: Mapping[str, str], body: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(id, source, field) of the first explicit id, or None."""

    def header(name: str) -> str | None:
        return _header(headers, name)

    def field(name: str) -> str | None:
        value = body.get(name)
        return value if isinstance(value, str) and value.strip() else None

    candidates: list[tuple[str | None, str, str]] = [
        (header("x-talaria-session-id"), "talaria", "X-Talaria-Session-Id"),
        (header("x-claude-code-session-id"), "claude-code", "X-Claude-Code-Session-Id"),
        (claude_code_session(body.get("metadata")), "claude-code", "metadata.user_id"),
        (header("session-id"), "codex", "session-id"),
        (header("thread-id"), "codex", "thread-id"),
        (field("prompt_cache_key"), "prompt_cache_key", "prompt_cache_key"),
        (header("x-session-id"), "x-session-id", "x-session-id"),
        (header("x-litellm-session-id"), "x-litellm-session-id", "x-litellm-session-id"),
        (field("litellm_session_id"), "litellm_session_id", "litellm_session_id"),
    ]
    for value, source, name in candidates:
        if value is not None:
            return value, source, name
    return None


def _gap_hint(headers: Mapping[str, str]) -> float | None:
    raw = headers.get("x-talaria-tool-gap-ms")
    if not raw:
        return None
    try:
        gap_s = float(raw) / 1000.0
    except ValueError as exc:
        raise IdentityError(
            "X-Talaria-Tool-Gap-Ms must be a number of milliseconds", "X-Talaria-Tool-Gap-Ms"
        ) from exc
    if not math.isfinite(gap_s) or not 0 <= gap_s <= MAX_TOOL_GAP_S:
        raise IdentityError(
            f"X-Talaria-Tool-Gap-Ms must be between 0 and {MAX_TOOL_GAP_S * 1000:.0f}",
            "X-Talaria-Tool-Gap-Ms",
        )
    return gap_s


def identify(headers: Mapping[str, str], body: Mapping[str, Any]) -> Identity:
    """The request's identity; ``IdentityError`` if an id or hint is malformed."""
    gap_s = _gap_hint(headers)
    final = headers.get("x-talaria-session-final", "").strip().lower() in ("true", "1", "yes")
    parent_raw = headers.get("x-talaria-parent-session-id")
    parent = valid_id(parent_raw, "X-Talaria-Parent-Session-Id") if parent_raw else None
    found = _explicit(headers, body)
    if found is None:
        return Identity(None, "implicit", parent, gap_s, final)
    value, source, name = found
    return Identity(valid_id(value, name), source, parent, gap_s, final)
