"""Turning a batch of records into rows: the body of ``SqlStore.write_batch``.

Dialect-neutral (no ``ON CONFLICT``), so the same code runs on SQLite and PostgreSQL. Each
table's existing rows are loaded with one ``SELECT ... IN`` per batch (chunked) as plain dicts;
every record is applied in order to those dicts or to new ones; then each table gets one bulk
``INSERT`` of its new rows and one bulk ``UPDATE`` (by primary key) of its changed ones,
sessions before the calls that reference them. No ORM unit of work: the writer runs on the
proxy's event loop, and per-object bookkeeping there cost every request in flight (a batch of
16 calls took 5 ms of the loop with ORM objects).

Nothing is ever upserted across tenants: a record whose row exists with another tenant (or,
for a call, in another session, which sessions are per tenant) is dropped (and logged). The
UPDATE of a session, call or stored response also matches the owner it was loaded with
(``WHERE key = :key AND tenant_id = :loaded_tenant``, as ``ON CONFLICT ... DO UPDATE ...
WHERE`` would), so a row that another transaction gave another owner meanwhile is left alone
too. Only a session's placeholder (tenant ``unknown``, below) takes a tenant.

A record's fields become its row's columns of the same names (``mapping.row_values``); the
rules below say how a row already there takes them.

Rules (the writer may retry a batch, so applying one twice must give the same rows):

- ``SessionRecord``: inserted if missing, else updated: model, tenant, parent (when given),
  ``started_at`` = min, ``last_call_at`` = max, ``ended_at`` / ``end_reason`` when given.
  An *ended* session stays ended when a later record says otherwise (a stale ``in_tool``
  written after the end), except that a record with state ``active`` whose ``last_call_at``
  is after ``ended_at`` reopens it (a new call arrived after the end): state ``active``,
  ``ended_at`` and ``end_reason`` cleared.
- ``CallRecord``: upserted by ``request_id`` within its session. On first insert its
  ``call_index`` is checked (a taken one becomes the session's next free one:
  call_numbers.py) and kept from then on, the session's
  ``calls`` goes up by one and its token counters by the call's tokens; a re-write (a retried
  batch, or the same call written again when it finished) moves the token counters by the
  difference only, so nothing is counted twice. A call for a session that has no row yet gets
  a placeholder session (tenant ``unknown``) that the session's own record later fills in.
- ``DecisionRecord`` and ``HintRecord``: inserted (``created_at`` defaults to now).
- ``ReservationRecord``: upserted by ``reservation_id``; release fields are set when given and
  never cleared by a later record without them.
- ``InstanceRecord``: upserted by name, every field replaced.
- a ``TableRecord`` (the table of a dialect: proxy/contract/records.py): upserted by its
  ``KEY`` within its ``OWNER``, every field replaced; written after the tables above.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Select, Table, Update, bindparam, insert, select, update
from sqlalchemy.engine import Connection

from talaria.proxy.contract.records import (
    CallRecord,
    DecisionRecord,
    HintRecord,
    InstanceRecord,
    Record,
    ReservationRecord,
    SessionRecord,
    TableRecord,
)
from talaria.proxy.store.call_numbers import CallNumbers
from talaria.proxy.store.mapping import SESSION_COUNTERS, row_values
from talaria.proxy.store.models import (
    Base,
    CallRow,
    DecisionRow,
    HintRow,
    InstanceRow,
    ReservationRow,
    SessionRow,
    as_utc,
)

UNKNOWN_TENANT = "unknown"
_IN_CHUNK = 500  # keys per IN (...) list: well under SQLite's and asyncpg's parameter limits

Row = dict[str, Any]
_KEY = "b_primary_key"  # the bind name of the key in an UPDATE ... WHERE key = :b_primary_key
_OWNER = "b_owner"  # ... AND owner = :b_owner: the owner column's value as loaded
log = logging.getLogger(__name__)


def _table(model: type[Base]) -> Table:
    return cast(Table, model.__table__)


@functools.cache
def _select_by_keys(model: type[Base], key: str, lock: bool = False) -> Select[Any]:
    """``SELECT * FROM table WHERE key IN :keys``, built once per table: one expanding
    parameter instead of a bind (and its coercion) per key. ``lock``: ``ORDER BY key FOR
    UPDATE`` (PostgreSQL; SQLite renders no lock, its writes are serialized anyway)."""
    table = _table(model)
    query = select(table).where(table.c[key].in_(bindparam("keys", expanding=True)))
    return query.order_by(table.c[key]).with_for_update() if lock else query


@functools.cache
def _update_by_key(
    model: type[Base], key: str, owner: str | None, columns: tuple[str, ...]
) -> Update:
    """``UPDATE table SET column = :column, ... WHERE key = :b_primary_key [AND owner =
    :b_owner]``, built once: a row whose owner (tenant, or a call's session) changed since it
    was loaded is left as it is."""
    table = _table(model)
    by_key = update(table).where(table.c[key] == bindparam(_KEY))
    if owner is not None:
        by_key = by_key.where(table.c[owner] == bindparam(_OWNER))
    return by_key.values({c: bindparam(c) for c in columns if c != key})


@dataclass
class _Table:
    """One table's rows touched by a batch: loaded ones and new ones, by primary key.
    ``owner``: the column that says whose a row is (a tenant, or a call's session), if any."""

    model: type[Base]
    key: str
    owner: str | None = None
    lock: bool = False
    """Load its rows ``FOR UPDATE`` (sessions: call_numbers.py says why)."""
    rows: dict[str, Row] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)
    """The owner of each loaded row, as loaded."""
    new: dict[str, Row] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)

    def get(self, key: str) -> Row | None:
        row = self.new.get(key)
        return row if row is not None else self.rows.get(key)

    def add(self, row: Row) -> Row:
        self.new[row[self.key]] = row
        return row

    def touch(self, key: str) -> None:
        if key not in self.new:
            self.changed.add(key)

    def load(self, db: Connection, keys: Iterable[str]) -> None:
        """The existing rows whose key is in ``keys``."""
        wanted = sorted(set(keys))
        query = _select_by_keys(self.model, self.key, self.lock)
        for start in range(0, len(wanted), _IN_CHUNK):
            chunk = wanted[start : start + _IN_CHUNK]
            result = db.execute(query, {"keys": chunk})
            for row in result.mappings():
                self.rows[row[self.key]] = dict(row)
                if self.owner is not None:
                    self.owners[row[self.key]] = row[self.owner]

    def write(self, db: Connection) -> None:
        """One INSERT of the new rows, one UPDATE (by primary key) of the changed, each an
        executemany of Core statements (the ORM's bulk paths cost ~1 ms a statement more)."""
        table = _table(self.model)
        if self.new:
            db.execute(insert(table), list(self.new.values()))
        if self.changed:
            rows = [self.rows[k] for k in sorted(self.changed)]
            statement = _update_by_key(self.model, self.key, self.owner, tuple(rows[0]))
            params = [{**row, _KEY: row[self.key]} for row in rows]
            if self.owner is not None:
                for param in params:
                    param[_OWNER] = self.owners[param[_KEY]]
            db.execute(statement, params)


def _refused(kind: str, key: str, owner: str) -> None:
    log.warning("dropped a %s record for %s: that row is another %s's", kind, key, owner)


def _new_session(rec: SessionRecord) -> Row:
    """The row of a session seen first: its record's fields, its key as the client's id when
    it has none, no calls counted yet."""
    row = row_values(rec)
    row["session_id"] = rec.session_id or rec.session_key
    row.update(dict.fromkeys(SESSION_COUNTERS, 0))
    return row


def _apply_session(sessions: _Table, rec: SessionRecord) -> None:
    row = sessions.get(rec.session_key)
    if row is not None and row["tenant_id"] not in (rec.tenant_id, UNKNOWN_TENANT):
        _refused("session", rec.session_key, "tenant")
        return
    if row is None:
        sessions.add(_new_session(rec))
        return
    sessions.touch(rec.session_key)
    row["tenant_id"] = rec.tenant_id
    row["model"] = rec.model
    if rec.session_id is not None:
        row["session_id"] = rec.session_id
    if rec.identity_source is not None:
        row["identity_source"] = rec.identity_source
    if rec.agent is not None:
        row["agent"] = rec.agent
    if rec.parent_session_key is not None:
        row["parent_session_key"] = rec.parent_session_key
    row["started_at"] = min(row["started_at"], as_utc(rec.started_at))
    row["last_call_at"] = max(row["last_call_at"], as_utc(rec.last_call_at))
    if row["state"] != "ended" or rec.state == "ended":
        row["state"] = rec.state
    elif rec.state == "active" and (
        row["ended_at"] is None or as_utc(rec.last_call_at) > row["ended_at"]
    ):
        row["state"], row["ended_at"], row["end_reason"] = "active", None, None
    if rec.ended_at is not None:
        row["ended_at"] = as_utc(rec.ended_at)
        if rec.end_reason is not None:
            row["end_reason"] = rec.end_reason


def _placeholder_session(rec: CallRecord) -> Row:
    """The row of a session known only from a call: tenant ``unknown``, active since the
    call arrived (the session's own record fills it in later)."""
    at = rec.arrived_at
    return _new_session(SessionRecord(rec.session_key, UNKNOWN_TENANT, rec.model, at, at))


_TOKENS = ("prompt_tokens", "cached_tokens", "output_tokens")


def _apply_call(sessions: _Table, calls: _Table, numbers: CallNumbers, rec: CallRecord) -> None:
    row = calls.get(rec.request_id)
    if row is not None and row["session_key"] != rec.session_key:
        _refused("call", rec.request_id, "session")
        return
    session = sessions.get(rec.session_key)
    if session is None:
        session = sessions.add(_placeholder_session(rec))
    sessions.touch(rec.session_key)
    fields = row_values(rec)
    if row is None:
        fields["call_index"] = numbers.number(rec.session_key, rec.call_index, rec.request_id)
        calls.add(fields)
        session["calls"] += 1
        for name in _TOKENS:
            session[name] += fields[name]
        return
    calls.touch(rec.request_id)
    for name in _TOKENS:
        session[name] += fields[name] - row[name]
    fields["call_index"] = row["call_index"]  # as first stored (call_numbers.py)
    row.update(fields)


_RELEASE = ("released_at", "release_reason")


def _apply_reservation(reservations: _Table, rec: ReservationRecord) -> None:
    fields = row_values(rec)
    row = reservations.get(rec.reservation_id)
    if row is None:
        reservations.add(fields)
        return
    reservations.touch(rec.reservation_id)
    for name in _RELEASE:  # set when given, never cleared
        if fields[name] is None:
            del fields[name]
    row.update(fields)


def _replace(table: _Table, key: str, fields: Row) -> None:
    """Upsert with every field replaced."""
    row = table.get(key)
    if row is None:
        table.add(fields)
    else:
        table.touch(key)
        row.update(fields)


def _owned_tables(db: Connection, records: Sequence[Record]) -> dict[type, _Table]:
    """Each ``TableRecord`` type of the batch's table, its rows loaded."""
    tables: dict[type, _Table] = {}
    for rec in records:
        if isinstance(rec, TableRecord) and type(rec) not in tables:
            kind = type(rec)
            table = tables[kind] = _Table(kind.ROW, kind.KEY, kind.OWNER)
            table.load(db, (getattr(r, kind.KEY) for r in records if type(r) is kind))
    return tables


def _apply_owned(table: _Table, rec: TableRecord) -> None:
    """Upsert ``rec`` by its key, unless its row belongs to another owner (dropped, logged)."""
    key = getattr(rec, rec.KEY)
    existing = table.get(key)
    if existing is not None and existing[rec.OWNER] != getattr(rec, rec.OWNER):
        _refused(type(rec).__name__, key, rec.OWNER)
        return
    _replace(table, key, row_values(rec))


def apply_batch(db: Connection, records: Sequence[Record]) -> None:
    """Apply ``records`` in order inside ``db``'s transaction (written, not committed). A
    plain function of a sync ``Connection`` (Core only, no ORM session):
    ``AsyncConnection.run_sync`` runs it on PostgreSQL (asyncpg), and the SQLite writer thread
    on its own connection (proxy/store/sqlite_writes.py)."""
    now = datetime.now(UTC)
    sessions = _Table(SessionRow, "session_key", "tenant_id", lock=True)
    calls = _Table(CallRow, "request_id", "session_key")
    reservations = _Table(ReservationRow, "reservation_id")
    instances = _Table(InstanceRow, "name")
    sessions.load(db, (r.session_key for r in records if isinstance(r, SessionRecord | CallRecord)))
    calls.load(db, (r.request_id for r in records if isinstance(r, CallRecord)))
    numbers = CallNumbers(_table(CallRow))
    numbers.load(
        db,
        (
            (r.session_key, r.call_index)
            for r in records
            if isinstance(r, CallRecord) and calls.get(r.request_id) is None
        ),
    )
    reservations.load(db, (r.reservation_id for r in records if isinstance(r, ReservationRecord)))
    instances.load(db, (r.name for r in records if isinstance(r, InstanceRecord)))
    owned = _owned_tables(db, records)
    decisions: list[Row] = []
    hints: list[Row] = []
    for rec in records:
        if isinstance(rec, SessionRecord):
            _apply_session(sessions, rec)
        elif isinstance(rec, CallRecord):
            _apply_call(sessions, calls, numbers, rec)
        elif isinstance(rec, DecisionRecord):
            decision = row_values(rec)
            decision["created_at"] = decision["created_at"] or now
            decisions.append(decision)
        elif isinstance(rec, HintRecord):
            hints.append(row_values(rec))
        elif isinstance(rec, ReservationRecord):
            _apply_reservation(reservations, rec)
        elif isinstance(rec, InstanceRecord):
            _replace(instances, rec.name, row_values(rec))
        elif isinstance(rec, TableRecord):
            _apply_owned(owned[type(rec)], rec)
        else:  # pragma: no cover - guarded by the Record union
            raise TypeError(f"not a store record: {type(rec).__name__}")
    for table in (sessions, calls, reservations, instances, *owned.values()):  # sessions first
        table.write(db)
    if decisions:
        db.execute(insert(_table(DecisionRow)), decisions)
    if hints:
        db.execute(insert(_table(HintRow)), hints)
