"""The HTTP names Talaria reads: session headers, the session endpoints, the reply header, and
where the server is when the caller does not say (``base_url_from_env``).

The proxy identifies a session by the first of ``X-Talaria-Session-Id``, ``x-session-id``,
``x-litellm-session-id``, body ``litellm_session_id``, body ``prompt_cache_key``
(docs/proxy.md, "Sessions"). The SDK always sends the first. ``X-Talaria-Priority`` and
``X-Talaria-Deadline-S`` say what a call's waiting costs (docs/proxy.md, "Headers").
"""

from __future__ import annotations

import os
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
PRIORITY = "X-Talaria-Priority"
"""The call's class: one of :data:`PRIORITIES` (over the API key's default)."""
DEADLINE_S = "X-Talaria-Deadline-S"
"""Seconds after its arrival by which the call should be done (above 0, at most a week)."""
MAX_DEADLINE_S = 7 * 24 * 3600.0
"""The longest deadline the proxy takes (a week)."""
PRIORITIES = ("interactive", "standard", "batch")
"""The classes, first served first: a person waits, an agent step, a batch run."""
REPLY_SESSION_ID = "x-talaria-session-id"
"""Set by Talaria on every chat reply: how the SDK tells a Talaria server from another one."""

DEFAULT_GAP_S = 3.0
"""The tool gap a session expects before it has observed one of its own."""

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
"""The local ``talaria serve``'s API."""


def base_url_from_env() -> str:
    """``TALARIA_BASE_URL``, else the local ``talaria serve`` default."""
    return os.environ.get("TALARIA_BASE_URL", DEFAULT_BASE_URL)


def has_header(headers: object, name: str) -> bool:
    """Whether ``headers`` (any mapping, any case; anything else: no) names ``name``."""
    if not isinstance(headers, Mapping):
        return False
    wanted = name.lower()
    return any(key.lower() == wanted for key in headers)


def check_priority(priority: str | None, deadline_s: float | None) -> str | None:
    """``priority`` in lower case (None: none); ``ValueError`` if it is not one of
    :data:`PRIORITIES` or ``deadline_s`` is not a number of seconds above 0 and at most
    :data:`MAX_DEADLINE_S`."""
    if deadline_s is not None and not (
        isinstance(deadline_s, int | float) and 0 < deadline_s <= MAX_DEADLINE_S
    ):
        raise ValueError(
            f"deadline_s must be seconds above 0 and at most {MAX_DEADLINE_S:.0f}, not {deadline_s}"
        )
    if priority is None:
        return None
    if priority.lower() not in PRIORITIES:
        raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}, not {priority!r}")
    return priority.lower()


def session_headers(
    session_id: str,
    parent: str | None = None,
    *,
    tool_gap_s: float | None = None,
    final: bool = False,
    priority: str | None = None,
    deadline_s: float | None = None,
) -> dict[str, str]:
    """The headers that put a call in session ``session_id`` (with ``priority``: its class;
    ``deadline_s``: its deadline); usable with any OpenAI client (``extra_headers=`` /
    ``default_headers=``) or any HTTP library. ``ValueError`` for a priority or deadline the
    proxy would refuse."""
    priority = check_priority(priority, deadline_s)
    headers = {SESSION_ID: session_id}
    if parent:
        headers[PARENT_SESSION_ID] = parent
    if tool_gap_s is not None:
        headers[TOOL_GAP_MS] = str(max(0, round(tool_gap_s * 1000)))
    if final:
        headers[SESSION_FINAL] = "true"
    if priority is not None:
        headers[PRIORITY] = priority
    if deadline_s is not None:
        headers[DEADLINE_S] = str(float(deadline_s))
    return headers


def endpoint_url(base_url: str, session_id: str, action: str) -> str:
    """``{base_url}/sessions/{id}/{action}`` (``hints`` or ``end``); ``base_url`` ends in /v1."""
    return f"{base_url.rstrip('/')}/sessions/{quote(session_id, safe='')}/{action}"
