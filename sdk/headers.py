"""The HTTP names Talaria reads: session headers, the session endpoints, and the reply header.

The proxy identifies a session by the first of ``X-Talaria-Session-Id``, ``x-session-id``,
``x-litellm-session-id``, body ``litellm_session_id``, body ``prompt_cache_key``
(docs/proxy.md, "Sessions"). The SDK always sends the first.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

SESSION_ID = "X-Talaria-Session-Id"
"""The session this call belongs to."""
PARENT_SESSION_ID = "X-Talaria-Parent-Session-Id"
"""The session that spawned this one (sub-agents)."""
TOOL_GAP_MS = "X-Talaria-Tool-Gap-Ms"
"""Milliseconds of tool time expected after this call, if it ends in a tool call."""
SESSION_FINAL = "X-Talaria-Session-Final"
"""``true``: this call is the session's last."""
REPLY_SESSION_ID = "x-talaria-session-id"
"""Set by Talaria on every chat reply: how the SDK tells a Talaria server from another one."""

DEFAULT_GAP_S = 3.0
"""The tool gap a session expects before it has observed one of its own."""


def has_header(headers: object, name: str) -> bool:
    """Whether ``headers`` (any mapping, any case; anything else: no) names ``name``."""
    if not isinstance(headers, Mapping):
        return False
    wanted = name.lower()
    return any(key.lower() == wanted for key in headers)


def session_headers(
    session_id: str,
    parent: str | None = None,
    *,
    tool_gap_s: float | None = None,
    final: bool = False,
) -> dict[str, str]:
    """The headers that put a call in session ``session_id``; usable with any OpenAI client
    (``extra_headers=`` / ``default_headers=``) or any HTTP library."""
    headers = {SESSION_ID: session_id}
    if parent:
        headers[PARENT_SESSION_ID] = parent
    if tool_gap_s is not None:
        headers[TOOL_GAP_MS] = str(max(0, round(tool_gap_s * 1000)))
    if final:
        headers[SESSION_FINAL] = "true"
    return headers


def endpoint_url(base_url: str, session_id: str, action: str) -> str:
    """``{base_url}/sessions/{id}/{action}`` (``hints`` or ``end``); ``base_url`` ends in /v1."""
    return f"{base_url.rstrip('/')}/sessions/{quote(session_id, safe='')}/{action}"
