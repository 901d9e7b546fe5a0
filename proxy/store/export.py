"""The proxy's stored calls as a replay trace (``talaria trace export``; docs/trace-format.md).

:func:`calls_to_sessions` is the conversion, pure, from the stored calls (as the
:class:`~talaria.proxy.contract.records.CallRecord` they were written from) and each
session's parent;
:func:`export_trace` is the query around it and :func:`export_from_url` opens the database.

Rules, for the calls of one stored session:

- Only successful calls are exported: ``status == "ok"`` with a ``finished_at``. They are put
  in arrival order (``arrived_at``, then the proxy's ``call_index``, then ``request_id``) and
  numbered 0..n−1, so dropped calls leave no gap. Arrival order, not ``call_index`` alone: the
  proxy numbers a session's calls from 0 again when the session comes back after its end or
  after a proxy restart; within one run of a session the two orders agree. A session left with
  no call is omitted.
- ``arrival_offset_s(i) = arrived_at(i) − t0`` in seconds, ``t0`` the earliest ``arrived_at``
  among all exported calls, so the trace starts at 0.
- ``new_tokens(0) = prompt_tokens(0)``; for i > 0, with
  ``d = prompt_tokens(i) − (prompt_tokens(i−1) + output_tokens(i−1))``:
  ``new_tokens(i) = d`` if ``0 ≤ d ≤ prompt_tokens(i)`` (the upper bound always holds: the
  counts are ≥ 0), else ``prompt_tokens(i)``. This assumes an append-only history, as the trace
  format does: a prompt shorter than the previous prompt + output is taken as a truncated or
  rewritten history, all of it new (token counts alone cannot tell an append from a rewrite
  that does not shorten the prompt).
- ``tool_gap_s(i) = max(0, arrived_at(i+1) − finished_at(i))`` for i < n−1 (0 when the agent
  sent call i+1 before call i's answer was complete); null on the last call.
- ``cached_tokens`` as stored; ``latency_s = max(0, finished_at − arrived_at)`` (clamped
  against a wall-clock step); ``ttft_s = queue_s + prefill_s`` when both are stored, else null;
  the trace's ``session_id`` is the stored session's key (``session_key``, not the client's
  id: two tenants' sessions stay two trace sessions), ``parent_session_id`` its row's
  ``parent_session_key``, and ``agent`` its row's ``agent`` (absent when null).
- A trace session has one model: a stored session whose exported calls name several models is
  an :class:`ExportError`, as is an exported call with no prompt or no output tokens.

Units: wall seconds throughout. ``arrived_at`` / ``finished_at`` are the proxy's wall clock;
``queue_s`` / ``prefill_s`` are the runtime's times, which the proxy stores divided by its
``--time-scale`` (proxy/callpath/recorder.py), so at ``--time-scale k`` they, ``ttft_s``,
offsets, gaps and ``latency_s`` are all wall seconds (one is k simulated seconds).

Sessions come back ordered by start (call 0's offset), then id, as ``write_trace`` writes them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import and_, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from talaria.core.trace import SessionTrace, TraceCall
from talaria.proxy.contract.records import CallRecord
from talaria.proxy.store.db import is_sqlite, make_engine, make_sessionmaker
from talaria.proxy.store.mapping import from_row
from talaria.proxy.store.models import CallRow, SessionRow, as_utc

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class ExportError(ValueError):
    """Stored calls that cannot make a valid trace; the message names the session."""


def parse_time(text: str, now: datetime) -> datetime:
    """``text`` as an aware UTC time: an ISO-8601 date or datetime (naive = UTC), or a duration
    before ``now``: a number and a unit ``s``, ``m``, ``h`` or ``d`` (``30m`` = ``now − 30 min``,
    ``2h``, ``1.5d``). ``ValueError`` naming the accepted forms otherwise."""
    value = text.strip()
    match = _DURATION.fullmatch(value)
    try:
        if match is not None:
            return as_utc(now) - timedelta(seconds=float(match[1]) * _UNIT_S[match[2]])
        return as_utc(datetime.fromisoformat(value))
    except (ValueError, OverflowError):
        raise ValueError(
            f"{text!r} is neither an ISO-8601 time (e.g. 2025-06-01T12:00:00, naive = UTC) "
            "nor a duration before now (e.g. 30m, 2h, 1d)"
        ) from None


def _seconds(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds()


def _new_tokens(prev: CallRecord | None, call: CallRecord) -> int:
    """``prompt − (prev prompt + prev output)`` when ≥ 0, else the whole prompt."""
    if prev is None:
        return call.prompt_tokens
    appended = call.prompt_tokens - (prev.prompt_tokens + prev.output_tokens)
    return appended if appended >= 0 else call.prompt_tokens


def _session(
    session_key: str,
    calls: Sequence[tuple[CallRecord, datetime]],
    t0: datetime,
    parent: str | None,
    agent: str,
) -> SessionTrace:
    """One session from its successful calls (each with its ``finished_at``), in order."""
    models = sorted({call.model for call, _ in calls})
    if len(models) > 1:
        raise ExportError(
            f"session {session_key!r} has calls to several models ({', '.join(models)}); "
            "a trace session has one model"
        )
    traced: list[TraceCall] = []
    for i, (call, finished) in enumerate(calls):
        if call.prompt_tokens < 1 or call.output_tokens < 1:
            raise ExportError(
                f"session {session_key!r}: call {call.request_id!r} has "
                f"{call.prompt_tokens} prompt and {call.output_tokens} output tokens "
                "(a trace needs both > 0)"
            )
        gap = None
        if i < len(calls) - 1:
            gap = max(0.0, _seconds(calls[i + 1][0].arrived_at, finished))
        ttft = None
        if call.queue_s is not None and call.prefill_s is not None:
            ttft = call.queue_s + call.prefill_s
        traced.append(
            TraceCall(
                session_id=session_key,
                call_index=i,
                model=call.model,
                arrival_offset_s=_seconds(call.arrived_at, t0),
                prompt_tokens=call.prompt_tokens,
                new_tokens=_new_tokens(calls[i - 1][0] if i else None, call),
                output_tokens=call.output_tokens,
                tool_gap_s=gap,
                cached_tokens=call.cached_tokens,
                latency_s=max(0.0, _seconds(finished, call.arrived_at)),
                ttft_s=ttft,
                parent_session_id=parent,
                agent=agent,
            )
        )
    start = traced[0].arrival_offset_s
    return SessionTrace(session_key, models[0], start, tuple(traced), agent=agent)


def calls_to_sessions(
    calls: Iterable[CallRecord],
    parents: Mapping[str, str | None],
    agents: Mapping[str, str | None] | None = None,
) -> list[SessionTrace]:
    """The trace of ``calls`` (any order, any sessions) by the rules of the module docstring;
    ``parents`` maps a session's key to its parent's (missing: none), ``agents`` to its agent
    kind (missing or None: unknown). Datetimes must all be aware (as the store returns them) or
    all naive."""
    agents = agents or {}
    done = [(c, c.finished_at) for c in calls if c.status == "ok" and c.finished_at is not None]
    if not done:
        return []
    t0 = min(call.arrived_at for call, _ in done)
    by_session: dict[str, list[tuple[CallRecord, datetime]]] = {}
    for call, finished in done:
        by_session.setdefault(call.session_key, []).append((call, finished))
    sessions = [
        _session(
            sid,
            sorted(group, key=lambda cf: (cf[0].arrived_at, cf[0].call_index, cf[0].request_id)),
            t0,
            parents.get(sid),
            agents.get(sid) or "",
        )
        for sid, group in by_session.items()
    ]
    return sorted(sessions, key=lambda s: (s.start_s, s.session_id))


async def export_trace(
    sessionmaker: async_sessionmaker[AsyncSession],
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    session_keys: Sequence[str] | None = None,
) -> list[SessionTrace]:
    """The stored sessions as a trace (see the module docstring), whole sessions only: a session
    is chosen by the arrival of its first successful call, ``since`` inclusive and ``until``
    exclusive (naive datetimes are UTC), and, when ``session_keys`` is given, by key."""
    ok = and_(CallRow.status == "ok", CallRow.finished_at.is_not(None))
    first_at = func.min(CallRow.arrived_at)
    chosen = select(CallRow.session_key).where(ok).group_by(CallRow.session_key)
    if session_keys is not None:
        chosen = chosen.where(CallRow.session_key.in_(sorted(set(session_keys))))
    if since is not None:
        chosen = chosen.having(first_at >= as_utc(since))
    if until is not None:
        chosen = chosen.having(first_at < as_utc(until))
    query = (
        select(CallRow, SessionRow.parent_session_key, SessionRow.agent)
        .join(SessionRow, SessionRow.session_key == CallRow.session_key)
        .where(ok, CallRow.session_key.in_(chosen))
    )
    async with sessionmaker() as db:
        rows = (await db.execute(query)).all()
    parents = {row.session_key: parent for row, parent, _ in rows}
    agents = {row.session_key: agent for row, _, agent in rows}
    return calls_to_sessions([from_row(CallRecord, row) for row, _, _ in rows], parents, agents)


async def export_from_url(
    url: str,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    session_keys: Sequence[str] | None = None,
) -> list[SessionTrace]:
    """:func:`export_trace` of the database at ``url``, read as it is (never migrated).

    A SQLite URL naming a file that does not exist raises ``FileNotFoundError`` (connecting
    would create an empty database); connection and query failures raise SQLAlchemy's errors.
    """
    if is_sqlite(url):
        path = make_url(url).database
        if path and path != ":memory:" and not path.startswith("file:") and not Path(path).exists():
            raise FileNotFoundError(f"no SQLite database at {path}")
    engine = make_engine(url)
    try:
        return await export_trace(
            make_sessionmaker(engine), since=since, until=until, session_keys=session_keys
        )
    finally:
        await engine.dispose()
