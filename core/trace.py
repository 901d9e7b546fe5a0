"""Agent-session traces: one LLM call per JSONL line (format in docs/trace-format.md).

A session is replayed closed-loop: call 0 is sent at ``arrival_offset_s`` (the session start);
call i > 0 is sent ``tool_gap_s(i-1)`` seconds after call i-1's answer. ``new_tokens`` is the
part of the prompt that is not the previous call's prompt + output:
``new_tokens(i) = prompt_tokens(i) − (prompt_tokens(i−1) + output_tokens(i−1))`` for an
append-only history, ``prompt_tokens(0)`` for call 0, and ``prompt_tokens(i)`` after a truncation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from talaria.core.types import DEFAULT_TENANT, Priority

FIELDS = (
    "session_id",
    "call_index",
    "model",
    "arrival_offset_s",
    "prompt_tokens",
    "new_tokens",
    "output_tokens",
    "tool_gap_s",
    "cached_tokens",
    "latency_s",
    "ttft_s",
    "parent_session_id",
    "parent_call_index",
    "parent_prefix_tokens",
    "tenant",
    "priority",
    "agent",
)
"""Every key a line may hold, in the order ``dumps_call`` writes them."""

_OPTIONAL = frozenset(
    {"tool_gap_s", "cached_tokens", "latency_s", "ttft_s", "parent_session_id",
     "parent_call_index", "parent_prefix_tokens", "tenant", "priority", "agent"}
)  # fmt: skip
# Characters that str.splitlines treats as line ends but json.dumps leaves raw in strings.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


class TraceError(ValueError):
    """A trace line or session is malformed; the message names file, line and field."""


@dataclass(frozen=True)
class TraceCall:
    """One LLM call of a session, as a trace line holds it.

    ``cached_tokens``, ``latency_s`` (finished − arrived) and ``ttft_s`` (queue + prefill) are
    what a live run measured (``talaria trace export``); the replay ignores them.
    """

    session_id: str
    call_index: int
    model: str
    arrival_offset_s: float
    prompt_tokens: int
    new_tokens: int
    output_tokens: int
    tool_gap_s: float | None
    cached_tokens: int | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    parent_session_id: str | None = None
    parent_call_index: int | None = None
    """A sub-agent's spawn: the parent's call after whose answer the child starts (the parent's
    next call then waits for the child's end); read from call 0. None: the child starts at its
    own ``arrival_offset_s``."""
    parent_prefix_tokens: int | None = None
    """Tokens at the start of the child's prompt equal to its parent's (system prompt and tools),
    which prefix caching may reuse from the parent's KV; read from call 0."""
    tenant: str = DEFAULT_TENANT
    """Whose session it is (absent: ``default``); the same on every call of a session."""
    priority: Priority = Priority.STANDARD
    """Its class (absent: ``standard``); the same on every call of a session."""
    agent: str = ""
    """The kind of agent that ran it (the proxy's ``agent``, e.g. ``claude-cli``; absent: "",
    unknown); the same on every call of a session. The node learns tool gaps per (tenant,
    model, agent) (core/gaps.py)."""


@dataclass(frozen=True)
class SessionTrace:
    """One session: its calls sorted by ``call_index``; ``start_s`` is call 0's offset; its
    tenant, class and agent kind are its calls'."""

    session_id: str
    model: str
    start_s: float
    calls: tuple[TraceCall, ...]
    tenant: str = DEFAULT_TENANT
    priority: Priority = Priority.STANDARD
    agent: str = ""

    @property
    def parent_session_id(self) -> str | None:
        """The parent session a sub-agent's calls name (call 0's), or None."""
        return self.calls[0].parent_session_id

    @property
    def num_calls(self) -> int:
        """How many calls the session has."""
        return len(self.calls)

    @property
    def total_output_tokens(self) -> int:
        """Output tokens summed over the session's calls."""
        return sum(c.output_tokens for c in self.calls)

    @property
    def total_tool_gap_s(self) -> float:
        """Sum of the tool gaps between calls (the last call has none)."""
        return sum(c.tool_gap_s for c in self.calls if c.tool_gap_s is not None)


def dumps_call(call: TraceCall) -> str:
    """One JSON line (no newline), keys in ``FIELDS`` order; absent optionals are omitted."""
    row: dict[str, Any] = {
        "session_id": call.session_id,
        "call_index": call.call_index,
        "model": call.model,
        "arrival_offset_s": float(call.arrival_offset_s),
        "prompt_tokens": call.prompt_tokens,
        "new_tokens": call.new_tokens,
        "output_tokens": call.output_tokens,
        "tool_gap_s": None if call.tool_gap_s is None else float(call.tool_gap_s),
    }
    if call.cached_tokens is not None:
        row["cached_tokens"] = call.cached_tokens
    if call.latency_s is not None:
        row["latency_s"] = float(call.latency_s)
    if call.ttft_s is not None:
        row["ttft_s"] = float(call.ttft_s)
    if call.parent_session_id is not None:
        row["parent_session_id"] = call.parent_session_id
    if call.parent_call_index is not None:
        row["parent_call_index"] = call.parent_call_index
    if call.parent_prefix_tokens is not None:
        row["parent_prefix_tokens"] = call.parent_prefix_tokens
    if call.tenant != DEFAULT_TENANT:
        row["tenant"] = call.tenant
    if call.priority is not Priority.STANDARD:
        row["priority"] = call.priority.value
    if call.agent:
        row["agent"] = call.agent
    text = json.dumps(row, ensure_ascii=False, allow_nan=False)
    return text.translate(_LINE_BREAKS)


def _fail(where: str, field: str, msg: str) -> TraceError:
    return TraceError(f"{where}: field {field!r}: {msg}")


def _str(row: dict[str, Any], key: str, where: str) -> str:
    value = row[key]
    if not isinstance(value, str) or not value:
        raise _fail(where, key, f"expected a non-empty string, got {value!r}")
    return value


def _int(row: dict[str, Any], key: str, where: str, low: int) -> int:
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, key, f"expected an integer, got {value!r}")
    if value < low:
        raise _fail(where, key, f"must be >= {low}, got {value}")
    return value


def _float(row: dict[str, Any], key: str, where: str) -> float:
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(where, key, f"expected a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise _fail(where, key, f"must be a finite number >= 0, got {value!r}")
    return float(value)


def _opt_float(row: dict[str, Any], key: str, where: str) -> float | None:
    """``_float`` of an optional key; absent or null reads as None."""
    return None if row.get(key) is None else _float(row, key, where)


def _opt_int(row: dict[str, Any], key: str, where: str) -> int | None:
    """``_int`` (>= 0) of an optional key; absent or null reads as None."""
    return None if row.get(key) is None else _int(row, key, where, 0)


def parse_call(line: str, where: str) -> TraceCall:
    """Parse and check one line; ``where`` (e.g. ``"t.jsonl:7"``) prefixes every error.

    Checks: a JSON object with only known keys; every required key present; types (integers are
    not booleans; floats are finite); ranges (``call_index >= 0``, ``prompt_tokens > 0``,
    ``0 <= new_tokens <= prompt_tokens``, ``output_tokens > 0``, ``0 <= cached_tokens <=
    prompt_tokens``, offsets, gaps, latencies and TTFTs >= 0). An absent ``tool_gap_s`` reads
    as null.
    """
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not valid JSON: {exc.msg}") from exc
    if not isinstance(row, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key in row:
        if key not in FIELDS:
            raise _fail(where, key, "unknown field")
    for key in FIELDS:
        if key not in row and key not in _OPTIONAL:
            raise _fail(where, key, "missing")
    prompt = _int(row, "prompt_tokens", where, 1)
    new = _int(row, "new_tokens", where, 0)
    if new > prompt:
        raise _fail(where, "new_tokens", f"{new} exceeds prompt_tokens {prompt}")
    cached = None if row.get("cached_tokens") is None else _int(row, "cached_tokens", where, 0)
    if cached is not None and cached > prompt:
        raise _fail(where, "cached_tokens", f"{cached} exceeds prompt_tokens {prompt}")
    gap = _opt_float(row, "tool_gap_s", where)
    parent = None
    if row.get("parent_session_id") is not None:
        parent = _str(row, "parent_session_id", where)
    spawn = _opt_int(row, "parent_call_index", where)
    shared = _opt_int(row, "parent_prefix_tokens", where)
    for key, value in (("parent_call_index", spawn), ("parent_prefix_tokens", shared)):
        if value is not None and parent is None:
            raise _fail(where, key, "needs parent_session_id")
    if shared is not None and shared > prompt:
        raise _fail(where, "parent_prefix_tokens", f"{shared} exceeds prompt_tokens {prompt}")
    tenant = DEFAULT_TENANT if row.get("tenant") is None else _str(row, "tenant", where)
    agent = "" if row.get("agent") is None else _str(row, "agent", where)
    try:
        priority = Priority(row.get("priority") or Priority.STANDARD)
    except ValueError:
        choices = ", ".join(p.value for p in Priority)
        raise _fail(where, "priority", f"one of {choices}, got {row['priority']!r}") from None
    return TraceCall(
        session_id=_str(row, "session_id", where),
        call_index=_int(row, "call_index", where, 0),
        model=_str(row, "model", where),
        arrival_offset_s=_float(row, "arrival_offset_s", where),
        prompt_tokens=prompt,
        new_tokens=new,
        output_tokens=_int(row, "output_tokens", where, 1),
        tool_gap_s=gap,
        cached_tokens=cached,
        latency_s=_opt_float(row, "latency_s", where),
        ttft_s=_opt_float(row, "ttft_s", where),
        parent_session_id=parent,
        parent_call_index=spawn,
        parent_prefix_tokens=shared,
        tenant=tenant,
        priority=priority,
        agent=agent,
    )


def _build_session(located: list[tuple[str, TraceCall]]) -> SessionTrace:
    """Check one session's calls (each with its location) and assemble it.

    Checks: no duplicate ``call_index``; indexes 0..n-1; one model; call 0 has
    ``new_tokens == prompt_tokens``; the last call's gap is null and every other call's is not.
    """
    located = sorted(located, key=lambda lc: lc[1].call_index)
    first_where, first = located[0]
    for expected, (where, call) in enumerate(located):
        if call.call_index != expected:
            dup = expected > 0 and call.call_index == located[expected - 1][1].call_index
            what = f"duplicate call {call.call_index}" if dup else f"missing call {expected}"
            raise _fail(where, "call_index", f"session {call.session_id!r}: {what} (need 0..n-1)")
    for expected, (where, call) in enumerate(located):
        for name in ("model", "tenant", "priority", "agent"):
            if getattr(call, name) != getattr(first, name):
                raise _fail(
                    where, name,
                    f"{getattr(call, name)!r} differs from {getattr(first, name)!r} at "
                    f"{first_where}",
                )  # fmt: skip
        last = expected == len(located) - 1
        if last and call.tool_gap_s is not None:
            raise _fail(where, "tool_gap_s", "must be null on the session's last call")
        if not last and call.tool_gap_s is None:
            raise _fail(where, "tool_gap_s", "missing on a call that is not the session's last")
    if first.new_tokens != first.prompt_tokens:
        raise _fail(first_where, "new_tokens", "must equal prompt_tokens on call 0")
    return SessionTrace(
        session_id=first.session_id,
        model=first.model,
        start_s=first.arrival_offset_s,
        calls=tuple(call for _, call in located),
        tenant=first.tenant,
        priority=first.priority,
        agent=first.agent,
    )


def _order(sessions: Sequence[SessionTrace]) -> list[SessionTrace]:
    return sorted(sessions, key=lambda s: (s.start_s, s.session_id))


def dumps_trace(sessions: Sequence[SessionTrace]) -> str:
    """The trace file's text: sessions (by ``start_s``, then id), each session's calls by
    index, one line each, every line ending in a newline.

    Each session is checked as ``read_trace`` would check it, so the text reads back.
    """
    lines: list[str] = []
    ids: set[str] = set()
    for session in _order(sessions):
        if session.session_id in ids or not session.calls:
            raise TraceError(f"session {session.session_id!r}: duplicate or empty")
        ids.add(session.session_id)
        located = [
            (f"session {session.session_id!r} call {c.call_index}", c) for c in session.calls
        ]
        for where, call in located:
            parse_call(dumps_call(call), where)
            if call.session_id != session.session_id:
                raise _fail(where, "session_id", f"{call.session_id!r} in the wrong session")
        built = _build_session(located)
        if (built.model, built.start_s, built.tenant, built.priority, built.agent) != (
            session.model,
            session.start_s,
            session.tenant,
            session.priority,
            session.agent,
        ):
            raise TraceError(
                f"session {session.session_id!r}: model/start_s/tenant/priority/agent disagree "
                f"with call 0's ({built.model!r}, {built.start_s}, {built.tenant!r}, "
                f"{built.priority.value!r}, {built.agent!r})"
            )
        lines.extend(dumps_call(call) for call in built.calls)
    return "".join(line + "\n" for line in lines)


def write_trace(path: str | Path, sessions: Sequence[SessionTrace]) -> None:
    """Write :func:`dumps_trace` of ``sessions`` to ``path`` (UTF-8)."""
    Path(path).write_text(dumps_trace(sessions), encoding="utf-8")


def read_trace(path: str | Path) -> list[SessionTrace]:
    """Read and check a trace; sessions come back ordered by ``start_s``, then id."""
    by_session: dict[str, list[tuple[str, TraceCall]]] = {}
    text = Path(path).read_text(encoding="utf-8")
    # split on "\n" only: str.splitlines would also break at U+2028 etc. inside JSON strings
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{lineno}"
        call = parse_call(line, where)
        by_session.setdefault(call.session_id, []).append((where, call))
    return _order([_build_session(located) for located in by_session.values()])
