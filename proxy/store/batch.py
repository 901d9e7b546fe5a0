"""Turning a batch of records into rows: the body of ``SqlStore.write_batch``.

Dialect-neutral (plain ORM adds and attribute updates, no ``ON CONFLICT``), so the same code
runs on SQLite and PostgreSQL. Each table's existing rows are loaded with one ``SELECT ... IN``
per batch (chunked), then every record is applied in order to those rows or to new ones; new
calls are inserted after the sessions they reference are flushed.

Rules (the writer may retry a batch, so applying one twice must give the same rows):

- ``SessionRecord``: inserted if missing, else updated: model, tenant, parent (when given),
  ``started_at`` = min, ``last_call_at`` = max, ``ended_at`` / ``end_reason`` when given.
  An *ended* session stays ended when a later record says otherwise (a stale ``in_tool``
  written after the end), except that a record with state ``active`` whose ``last_call_at``
  is after ``ended_at`` reopens it (a new call arrived after the end): state ``active``,
  ``ended_at`` and ``end_reason`` cleared.
- ``CallRecord``: upserted by ``request_id``. On first insert the session's ``calls`` goes up
  by one and its token counters by the call's tokens; a re-write (a retried batch, or the same
  call written again when it finished) moves the token counters by the difference only, so
  nothing is counted twice. A call for a session that has no row yet gets a placeholder session
  (tenant ``unknown``) that the session's own record later fills in.
- ``DecisionRecord`` and ``HintRecord``: inserted (``created_at`` defaults to now).
- ``ReservationRecord``: upserted by ``reservation_id``; release fields are set when given and
  never cleared by a later record without them.
- ``InstanceRecord``: upserted by name, every field replaced.
- ``ResponseRecord``: upserted by ``response_id``, every field replaced.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute

from talaria.proxy.records import (
    CallRecord,
    DecisionRecord,
    HintRecord,
    InstanceRecord,
    Record,
    ReservationRecord,
    ResponseRecord,
    SessionRecord,
)
from talaria.proxy.store.models import (
    Base,
    CallRow,
    DecisionRow,
    HintRow,
    InstanceRow,
    ReservationRow,
    SessionRow,
    StoredResponse,
    as_utc,
)

UNKNOWN_TENANT = "unknown"
_IN_CHUNK = 500  # keys per IN (...) list: well under SQLite's and asyncpg's parameter limits

RowT = TypeVar("RowT", bound=Base)


async def _load(
    db: AsyncSession, model: type[RowT], key: InstrumentedAttribute[str], keys: Iterable[str]
) -> dict[str, RowT]:
    """The existing rows of ``model`` whose ``key`` is in ``keys``, by key."""
    wanted = sorted(set(keys))
    found: dict[str, RowT] = {}
    for start in range(0, len(wanted), _IN_CHUNK):
        chunk = wanted[start : start + _IN_CHUNK]
        rows = (await db.scalars(select(model).where(key.in_(chunk)))).all()
        for row in rows:
            found[getattr(row, key.key)] = row
    return found


def _opt(value: datetime | None) -> datetime | None:
    return None if value is None else as_utc(value)


def _apply_session(db: AsyncSession, rows: dict[str, SessionRow], rec: SessionRecord) -> None:
    row = rows.get(rec.session_id)
    if row is None:
        row = SessionRow(
            session_id=rec.session_id,
            tenant_id=rec.tenant_id,
            external_id=rec.external_id or rec.session_id,
            identity_source=rec.identity_source,
            parent_session_id=rec.parent_session_id,
            model=rec.model,
            state=rec.state,
            started_at=as_utc(rec.started_at),
            last_call_at=as_utc(rec.last_call_at),
            ended_at=_opt(rec.ended_at),
            end_reason=rec.end_reason,
            calls=0,
            prompt_tokens=0,
            cached_tokens=0,
            output_tokens=0,
        )
        db.add(row)
        rows[rec.session_id] = row
        return
    row.tenant_id = rec.tenant_id
    row.model = rec.model
    if rec.external_id is not None:
        row.external_id = rec.external_id
    if rec.identity_source is not None:
        row.identity_source = rec.identity_source
    if rec.parent_session_id is not None:
        row.parent_session_id = rec.parent_session_id
    row.started_at = min(row.started_at, as_utc(rec.started_at))
    row.last_call_at = max(row.last_call_at, as_utc(rec.last_call_at))
    if row.state != "ended" or rec.state == "ended":
        row.state = rec.state
    elif rec.state == "active" and (
        row.ended_at is None or as_utc(rec.last_call_at) > row.ended_at
    ):
        row.state, row.ended_at, row.end_reason = "active", None, None
    if rec.ended_at is not None:
        row.ended_at = as_utc(rec.ended_at)
        row.end_reason = rec.end_reason if rec.end_reason is not None else row.end_reason


def _call_fields(rec: CallRecord) -> dict[str, Any]:
    return {
        "session_id": rec.session_id,
        "call_index": rec.call_index,
        "model": rec.model,
        "instance": rec.instance,
        "arrived_at": as_utc(rec.arrived_at),
        "finished_at": _opt(rec.finished_at),
        "status": rec.status,
        "queue_s": rec.queue_s,
        "prefill_s": rec.prefill_s,
        "decode_s": rec.decode_s,
        "prompt_tokens": rec.prompt_tokens,
        "cached_tokens": rec.cached_tokens,
        "output_tokens": rec.output_tokens,
        "finish_reason": rec.finish_reason,
        "kv_source": rec.kv_source,
        "stream": rec.stream,
        "tool_gap_hint_s": rec.tool_gap_hint_s,
        "error": rec.error,
        "api": rec.api,
    }


def _placeholder_session(rec: CallRecord) -> SessionRow:
    arrived = as_utc(rec.arrived_at)
    return SessionRow(
        session_id=rec.session_id,
        tenant_id=UNKNOWN_TENANT,
        external_id=rec.session_id,
        identity_source=None,
        parent_session_id=None,
        model=rec.model,
        state="active",
        started_at=arrived,
        last_call_at=arrived,
        ended_at=None,
        end_reason=None,
        calls=0,
        prompt_tokens=0,
        cached_tokens=0,
        output_tokens=0,
    )


def _apply_call(
    db: AsyncSession,
    sessions: dict[str, SessionRow],
    calls: dict[str, CallRow],
    new_calls: list[CallRow],
    rec: CallRecord,
) -> None:
    session = sessions.get(rec.session_id)
    if session is None:
        session = _placeholder_session(rec)
        db.add(session)
        sessions[rec.session_id] = session
    row = calls.get(rec.request_id)
    if row is None:
        row = CallRow(request_id=rec.request_id, **_call_fields(rec))
        new_calls.append(row)  # added after the sessions are flushed (see apply_batch)
        calls[rec.request_id] = row
        session.calls += 1
        session.prompt_tokens += rec.prompt_tokens
        session.cached_tokens += rec.cached_tokens
        session.output_tokens += rec.output_tokens
        return
    if row.session_id == rec.session_id:
        session.prompt_tokens += rec.prompt_tokens - row.prompt_tokens
        session.cached_tokens += rec.cached_tokens - row.cached_tokens
        session.output_tokens += rec.output_tokens - row.output_tokens
    for name, value in _call_fields(rec).items():
        setattr(row, name, value)


def _apply_reservation(
    db: AsyncSession, rows: dict[str, ReservationRow], rec: ReservationRecord
) -> None:
    row = rows.get(rec.reservation_id)
    if row is None:
        row = ReservationRow(reservation_id=rec.reservation_id, released_at=None)
        db.add(row)
        rows[rec.reservation_id] = row
    row.session_id = rec.session_id
    row.instance = rec.instance
    row.held_bytes = rec.held_bytes
    row.created_at = as_utc(rec.created_at)
    row.expected_return_at = as_utc(rec.expected_return_at)
    row.expires_at = as_utc(rec.expires_at)
    if rec.released_at is not None:
        row.released_at = as_utc(rec.released_at)
    if rec.release_reason is not None:
        row.release_reason = rec.release_reason


def _apply_response(db: AsyncSession, rows: dict[str, StoredResponse], rec: ResponseRecord) -> None:
    row = rows.get(rec.response_id)
    if row is None:
        row = StoredResponse(response_id=rec.response_id)
        db.add(row)
        rows[rec.response_id] = row
    row.tenant_id = rec.tenant_id
    row.session_id = rec.session_id
    row.model = rec.model
    row.created_at = as_utc(rec.created_at)
    row.expires_at = as_utc(rec.expires_at)
    row.response = dict(rec.response)
    row.input_items = list(rec.input_items)


def _apply_instance(db: AsyncSession, rows: dict[str, InstanceRow], rec: InstanceRecord) -> None:
    row = rows.get(rec.name)
    if row is None:
        row = InstanceRow(name=rec.name)
        db.add(row)
        rows[rec.name] = row
    row.kind = rec.kind
    row.url = rec.url
    row.models = list(rec.models)
    row.last_seen_at = as_utc(rec.last_seen_at)
    row.status = dict(rec.status)


async def apply_batch(db: AsyncSession, records: Sequence[Record]) -> None:
    """Apply ``records`` in order inside ``db``'s transaction (flushed, not committed)."""
    now = datetime.now(UTC)
    sessions = await _load(
        db,
        SessionRow,
        SessionRow.session_id,
        (r.session_id for r in records if isinstance(r, SessionRecord | CallRecord)),
    )
    calls = await _load(
        db,
        CallRow,
        CallRow.request_id,
        (r.request_id for r in records if isinstance(r, CallRecord)),
    )
    reservations = await _load(
        db,
        ReservationRow,
        ReservationRow.reservation_id,
        (r.reservation_id for r in records if isinstance(r, ReservationRecord)),
    )
    instances = await _load(
        db,
        InstanceRow,
        InstanceRow.name,
        (r.name for r in records if isinstance(r, InstanceRecord)),
    )
    responses = await _load(
        db,
        StoredResponse,
        StoredResponse.response_id,
        (r.response_id for r in records if isinstance(r, ResponseRecord)),
    )
    new_calls: list[CallRow] = []
    # Append-only rows nothing reads back by id: one bulk INSERT each per batch (an ORM add per
    # row made the writer fall behind the request rate under sustained load).
    decisions: list[dict[str, Any]] = []
    hints: list[dict[str, Any]] = []
    for rec in records:
        if isinstance(rec, SessionRecord):
            _apply_session(db, sessions, rec)
        elif isinstance(rec, CallRecord):
            _apply_call(db, sessions, calls, new_calls, rec)
        elif isinstance(rec, DecisionRecord):
            decisions.append(
                {
                    "request_id": rec.request_id,
                    "session_id": rec.session_id,
                    "router": rec.router,
                    "instance": rec.instance,
                    "reason": rec.reason,
                    "scores": {k: dict(v) for k, v in rec.scores.items()},
                    "created_at": _opt(rec.created_at) or now,
                }
            )
        elif isinstance(rec, HintRecord):
            hints.append(
                {
                    "session_id": rec.session_id,
                    "at": as_utc(rec.at),
                    "expected_s": rec.expected_s,
                    "tool": rec.tool,
                    "kind": rec.kind,
                }
            )
        elif isinstance(rec, ReservationRecord):
            _apply_reservation(db, reservations, rec)
        elif isinstance(rec, InstanceRecord):
            _apply_instance(db, instances, rec)
        elif isinstance(rec, ResponseRecord):
            _apply_response(db, responses, rec)
        else:  # pragma: no cover - guarded by the Record union
            raise TypeError(f"not a store record: {type(rec).__name__}")
    # The unit of work orders tables by relationships, not foreign keys, and the models
    # declare none: flush the sessions first so that the new calls' foreign keys resolve.
    await db.flush()
    if new_calls:
        db.add_all(new_calls)
        await db.flush()
    if decisions:
        await db.execute(insert(DecisionRow), decisions)
    if hints:
        await db.execute(insert(HintRow), hints)
