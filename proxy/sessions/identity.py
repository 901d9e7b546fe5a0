"""Session identity from a request's headers and body, without any help from the client.

A session is what the agent says it is. Explicit ids, first match wins (docs/proxy.md has this
as a table with each header's source, docs/agents.md what each agent sends):

- Talaria: header ``X-Talaria-Session-Id``;
- Claude Code: header ``X-Claude-Code-Session-Id``; else body ``metadata.user_id``, a JSON
  string with ``session_id`` (current versions) or ``user_<hash>_account_<uuid>_session_<uuid>``
  (older ones);
- Codex CLI: header ``session-id``, else ``thread-id``;
- NVIDIA Dynamo's clients: header ``X-Dynamo-Session-ID``;
- OpenAI: body ``prompt_cache_key``;
- aliases: header ``x-session-id`` (OpenCode's), header ``x-session-affinity`` (OpenCode's too,
  the same value), header ``x-litellm-session-id``, body ``litellm_session_id``;
- an operator's own headers (``TALARIA_SESSION_HEADERS``: ``session_sources``), each at the
  rank it is given, else after these.

A sub-agent is a *child* session only when the request names its parent (children are never
guessed):

- Claude Code: ``x-claude-code-agent-id`` names the sub-agent, whose session id it becomes;
  its parent is ``x-claude-code-parent-agent-id`` (a sub-agent's sub-agent), else the Claude
  Code session id;
- Codex: ``x-codex-parent-thread-id`` names the parent thread; the call's own id is its
  ``thread-id``;
- ``X-Talaria-Parent-Session-Id``, and as aliases ``X-Dynamo-Parent-Session-ID`` and
  OpenCode's ``x-parent-session-id``.

With no id, the call is *implicit*: the session book finds the session whose conversation it
extends (resolve.py). Every id is validated the same way wherever it came from: 1 to 200
printable ASCII characters (no control characters), so it is safe to echo in a header.

The agent's *kind* (``agent_kind``), which the node learns tool gaps by: the product name
of its ``User-Agent`` (``claude-cli``, ``codex_cli_rs``, ...), else where its session id came
from.

Hints: ``X-Talaria-Tool-Gap-Ms`` (tool time expected after this call; finite, 0 to
``MAX_TOOL_GAP_S``; the door counts a hint as at most ``TALARIA_MAX_HINT_GAP_S``, 240 s),
``X-Talaria-Session-Final: true`` (or ``X-Dynamo-Session-Final``): the session ends with this
call. The call's terms in the node's fair queue: ``X-Talaria-Priority`` (``interactive``,
``standard`` or ``batch``, any case; within the API key's ceiling: proxy/contract/calls.py
``Caller.served``) and ``X-Talaria-Deadline-S`` (seconds after its arrival by which it should
be done; finite, above 0, at most ``MAX_DEADLINE_S``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from talaria.core.types import Priority
from talaria.proxy.contract.identity import Identity

MAX_SESSION_ID_CHARS = 200
MAX_USER_ID_CHARS = 1024
"""A longer ``metadata.user_id`` is not read for a session id: Claude Code's is ~170
characters of JSON (three ids), and parsing the client's JSON held the event loop for
0.6 s when it was 8 MiB of empty arrays."""
MAX_TOOL_GAP_S = 24 * 3600.0
"""A tool gap hint beyond a day is refused (no route preference should outlive that)."""
MAX_DEADLINE_S = 7 * 24 * 3600.0
"""A deadline beyond a week is refused (it would order nothing, and clock seconds of a scaled
clock must stay finite)."""
MAX_AGENT_CHARS = 40
"""A longer ``User-Agent`` product name is not an agent's kind (the identity source is)."""
PRIORITY_HEADER = "X-Talaria-Priority"
DEADLINE_HEADER = "X-Talaria-Deadline-S"
_VALID_ID = re.compile(rf"[\x20-\x7e]{{1,{MAX_SESSION_ID_CHARS}}}")
_LEGACY_CLAUDE = re.compile(r"_session_([0-9a-fA-F-]{8,64})$")


class IdentityError(ValueError):
    """A session id or hint is malformed; ``field`` names where it came from, ``code`` is the
    400's (``invalid_session`` for an id or a session hint, ``invalid_value`` for the call's
    priority or deadline)."""

    def __init__(self, message: str, field: str, code: str = "invalid_session") -> None:
        super().__init__(message)
        self.field = field
        self.code = code


def valid_id(value: str, field: str) -> str:
    """``value`` stripped, or ``IdentityError`` if it is not 1–200 printable ASCII characters."""
    stripped = value.strip()
    if not _VALID_ID.fullmatch(stripped):
        raise IdentityError(
            f"{field} must be 1 to {MAX_SESSION_ID_CHARS} printable ASCII characters", field
        )
    return stripped


def claude_code_session(metadata: Any) -> str | None:
    """The session id inside Claude Code's ``metadata.user_id``, if any (none from one
    longer than ``MAX_USER_ID_CHARS``)."""
    if not isinstance(metadata, Mapping):
        return None
    user_id = metadata.get("user_id")
    if not isinstance(user_id, str) or not user_id or len(user_id) > MAX_USER_ID_CHARS:
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


SESSION_ID_SOURCES: tuple[tuple[str, str, str, str], ...] = (
    ("header", "x-talaria-session-id", "talaria", "X-Talaria-Session-Id"),
    ("header", "x-claude-code-session-id", "claude-code", "X-Claude-Code-Session-Id"),
    ("metadata", "metadata", "claude-code", "metadata.user_id"),
    ("header", "session-id", "codex", "session-id"),
    ("header", "thread-id", "codex", "thread-id"),
    ("header", "x-dynamo-session-id", "dynamo", "X-Dynamo-Session-ID"),
    ("body", "prompt_cache_key", "prompt_cache_key", "prompt_cache_key"),
    ("header", "x-session-id", "x-session-id", "x-session-id"),
    ("header", "x-session-affinity", "x-session-affinity", "x-session-affinity"),
    ("header", "x-litellm-session-id", "x-litellm-session-id", "x-litellm-session-id"),
    ("body", "litellm_session_id", "litellm_session_id", "litellm_session_id"),
)
"""Where an explicit session id is read, first match wins: (where: a ``header`` (lower
case), a ``body`` field, or Claude Code's ``metadata``; its name; the source it is recorded
as; the name errors show). The one rule for a session's name: the proxy's identity reads it,
and a balancer's hash key (proxy/cluster/owner.py ``AFFINITY_HEADERS``, deploy/nginx/
talaria.conf) takes the first of its headers."""

Source = tuple[str, str, str, str]
"""A row of ``SESSION_ID_SOURCES``."""
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An HTTP field name (RFC 9110 §5.1: a token)."""


def headers_of(sources: Sequence[Source]) -> tuple[str, ...]:
    """The session headers of an identity table, in rank order."""
    return tuple(name for where, name, _, _ in sources if where == "header")


SESSION_HEADERS = headers_of(SESSION_ID_SOURCES)
"""The built-in session headers, in rank order."""


@lru_cache(maxsize=8)
def session_sources(extra: str = "") -> tuple[Source, ...]:
    """The identity table with an operator's headers (``TALARIA_SESSION_HEADERS``): a comma-
    separated list of ``name`` or ``name:rank``, where ``rank`` is the header's 1-based place
    in the table (1: before ``X-Talaria-Session-Id``); without one, after the built-in rows,
    in the order given. Recorded as their own name. ``ValueError`` naming the entry for a name
    that is not an HTTP field name, a built-in header, a repeated name, or a rank outside the
    table."""
    table = list(SESSION_ID_SOURCES)
    known = {name for where, name, _, _ in table if where == "header"}
    for entry in (e.strip() for e in extra.split(",")):
        if not entry:
            continue
        name, colon, rank_text = (part.strip() for part in entry.partition(":"))
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"TALARIA_SESSION_HEADERS: {name!r} is not an HTTP header name")
        name = name.lower()
        if name in known:
            raise ValueError(f"TALARIA_SESSION_HEADERS: {name} is already a session header")
        rank = len(table) + 1
        if colon:
            try:
                rank = int(rank_text)
            except ValueError:
                rank = 0
            if not 1 <= rank <= len(table) + 1:
                raise ValueError(
                    f"TALARIA_SESSION_HEADERS: {entry!r}: the rank must be 1 to {len(table) + 1}"
                )
        table.insert(rank - 1, ("header", name, name, name))
        known.add(name)
    return tuple(table)


def outranking_headers(sources: Sequence[Source]) -> tuple[str, ...]:
    """The headers ranked above every body field (built in: the first two rows)."""
    found = []
    for where, name, _, _ in sources:
        if where != "header":
            break
        found.append(name)
    return tuple(found)


FINAL_HEADERS = ("x-talaria-session-final", "x-dynamo-session-final")
PARENT_HEADERS = (
    ("x-talaria-parent-session-id", "X-Talaria-Parent-Session-Id"),
    ("x-dynamo-parent-session-id", "X-Dynamo-Parent-Session-ID"),
    ("x-parent-session-id", "x-parent-session-id"),
)
"""Headers that name a parent session outright (lower case, and as reported in errors)."""


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    return value if value and value.strip() else None


def named_by_header(
    headers: Mapping[str, str], sources: Sequence[Source] = SESSION_ID_SOURCES
) -> bool:
    """Whether a header that outranks every body field names the session: then
    ``identify(headers, body)`` is ``identify(headers, {})``, known before the body is read."""
    return any(_header(headers, name) is not None for name in outranking_headers(sources))


Found = tuple[str, str, str]
"""(value, source, the field it came from)."""


def _explicit(
    headers: Mapping[str, str], body: Mapping[str, Any], sources: Sequence[Source]
) -> Found | None:
    """The first explicit id of ``sources``, or None."""
    for where, name, source, shown in sources:
        value: str | None
        if where == "header":
            value = _header(headers, name)
        elif where == "metadata":
            value = claude_code_session(body.get(name))
        else:
            given = body.get(name)
            value = given if isinstance(given, str) and given.strip() else None
        if value is not None:
            return value, source, shown
    return None


def _sub_agent(headers: Mapping[str, str], found: Found | None) -> tuple[Found, Found] | None:
    """An agent's own sub-agent headers: (the sub-agent's id, its parent's id), or None.
    Claude Code: ``x-claude-code-agent-id`` under its session id (parent: the parent agent,
    else that session); Codex: ``x-codex-parent-thread-id`` with the call's ``thread-id``."""
    agent = _header(headers, "x-claude-code-agent-id")
    if agent is not None and found is not None and found[1] in ("claude-code", "talaria"):
        parent_agent = _header(headers, "x-claude-code-parent-agent-id")
        parent = (
            (parent_agent, "claude-code", "x-claude-code-parent-agent-id")
            if parent_agent is not None
            else found
        )
        return (agent, "claude-code", "x-claude-code-agent-id"), parent
    parent_thread = _header(headers, "x-codex-parent-thread-id")
    thread = _header(headers, "thread-id")
    if parent_thread is not None and thread is not None:
        return (thread, "codex", "thread-id"), (parent_thread, "codex", "x-codex-parent-thread-id")
    return None


def _parent(headers: Mapping[str, str]) -> str | None:
    for name, shown in PARENT_HEADERS:
        raw = headers.get(name)
        if raw:
            return valid_id(raw, shown)
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


def _priority(headers: Mapping[str, str]) -> Priority | None:
    raw = headers.get(PRIORITY_HEADER.lower())
    if not raw:
        return None
    try:
        return Priority(raw.strip().lower())
    except ValueError:
        named = ", ".join(p.value for p in Priority)
        raise IdentityError(
            f"{PRIORITY_HEADER} must be one of {named} (got {raw.strip()[:40]!r})",
            PRIORITY_HEADER,
            "invalid_value",
        ) from None


def _deadline(headers: Mapping[str, str]) -> float | None:
    raw = headers.get(DEADLINE_HEADER.lower())
    if not raw:
        return None
    try:
        deadline_s = float(raw)
    except ValueError:
        deadline_s = math.nan
    if not math.isfinite(deadline_s) or not 0 < deadline_s <= MAX_DEADLINE_S:
        raise IdentityError(
            f"{DEADLINE_HEADER} must be a number of seconds above 0 and at most "
            f"{MAX_DEADLINE_S:.0f}",
            DEADLINE_HEADER,
            "invalid_value",
        )
    return deadline_s


def agent_kind(headers: Mapping[str, str], source: str) -> str:
    """The kind of agent a request comes from: the product name its ``User-Agent`` starts with
    (RFC 9110 §10.1.5: ``product = token ["/" product-version]``), lower case, when that is a
    token of at most ``MAX_AGENT_CHARS`` characters (Claude Code: ``claude-cli``; Codex:
    ``codex_cli_rs``, ``codex_exec`` headless; Qwen Code: ``qwencode``; the openai Python
    client: ``openai``; docs/sources.md §9); else
    ``source``, where its session id came from ("implicit" when nothing named it)."""
    product = headers.get("user-agent", "").strip().split("/", 1)[0].split(None, 1)
    name = product[0].lower() if product else ""
    if len(name) <= MAX_AGENT_CHARS and _TOKEN.fullmatch(name):
        return name
    return source


def identify(
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    sources: Sequence[Source] = SESSION_ID_SOURCES,
) -> Identity:
    """The request's identity and its call's hints (the id from ``sources``, the identity
    table: ``session_sources``); ``IdentityError`` if an id or hint is malformed."""
    gap_s = _gap_hint(headers)
    priority, deadline_s = _priority(headers), _deadline(headers)
    final = any(
        headers.get(name, "").strip().lower() in ("true", "1", "yes") for name in FINAL_HEADERS
    )
    found = _explicit(headers, body, sources)
    parent = _parent(headers)
    family = None
    sub_agent = _sub_agent(headers, found)
    if sub_agent is not None:
        if found is not None and found[1] == sub_agent[0][1] == "claude-code":
            family = valid_id(found[0], found[2])  # the main agent's session
        found, (parent_value, _, parent_field) = sub_agent
        parent = valid_id(parent_value, parent_field)
    if found is None:
        agent = agent_kind(headers, "implicit")
        return Identity(None, "implicit", parent, gap_s, final, None, priority, deadline_s, agent)
    value, source, name = found
    return Identity(
        valid_id(value, name),
        source,
        parent,
        gap_s,
        final,
        family,
        priority,
        deadline_s,
        agent_kind(headers, source),
    )
