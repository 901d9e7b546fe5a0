"""``SqlStore``: the session store's reads and writes over an ``async_sessionmaker``.

Writes arrive in batches from the :class:`~talaria.proxy.store.writer.BatchWriter` (see
``batch.py`` for how each record becomes rows); reads return the frozen views of ``views.py``.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

from sqlalchemy import ColumnElement, and_, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from talaria.proxy.records import InstanceRecord, Record
from talaria.proxy.store.batch import apply_batch
from talaria.proxy.store.health import SqliteFileGuard, is_content_error
from talaria.proxy.store.models import (
    ApiKey,
    CallRow,
    DeadLetter,
    DecisionRow,
    DrainRow,
    HintRow,
    InstanceRow,
    ReplicaRow,
    ReservationRow,
    SessionRow,
    StoredResponse,
    Tenant,
    as_utc,
)
from talaria.proxy.store.views import (
    ApiKeyInfo,
    DeadLetterView,
    SessionDetail,
    SessionPage,
    SessionSummary,
    StoredResponseView,
    call_view,
    decision_view,
    decode_cursor,
    encode_cursor,
    hint_view,
    instance_view,
    key_view,
    reservation_view,
    session_view,
)

API_KEY_PREFIX = "tk-"
SESSION_STATES = ("active", "in_tool", "ended")
DELETED_KEY_HASH_PREFIX = "deleted:"
"""The ``key_hash`` of a deleted key is this plus its id: never a SHA-256 hex digest."""
MAX_PAGE = 1000


def hash_key(plaintext: str) -> str:
    """The stored form of an API key: SHA-256, hex."""
    return hashlib.sha256(plaintext.encode()).hexdigest()


class SqlStore:
    """Sessions, calls, routing decisions, reservations, hints, instances, tenants, API keys,
    dead letters. With a ``guard`` (a SQLite file), every write first checks that the file is
    still the one the proxy opened (health.py)."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        guard: SqliteFileGuard | None = None,
    ) -> None:
        self._sessionmaker = sessionmaker
        self._guard = guard

    async def write_batch(self, records: Sequence[Record]) -> None:
        """Apply ``records`` in order, in one transaction (all or nothing). Safe to retry.
        ``StoreFileGone`` if the SQLite file was deleted or replaced."""
        if not records:
            return
        if self._guard is not None:
            self._guard.check()
        async with self._sessionmaker() as db, db.begin():
            connection = await db.connection()
            await connection.run_sync(apply_batch, records)

    def is_content_error(self, exc: BaseException) -> bool:
        """Whether a write failed for the records' content (health.is_content_error)."""
        return is_content_error(exc)

    async def ping(self) -> None:
        """Raise unless the database answers a query (and its SQLite file is still there)."""
        if self._guard is not None:
            self._guard.check()
        async with self._sessionmaker() as db:
            await db.execute(select(1))

    async def end_open_sessions(
        self, reason: str, at: datetime, last_call_before: datetime | None = None
    ) -> int:
        """End every session not ended (and release its reservations): what a proxy that
        stopped left open. Returns how many sessions it ended. A lone proxy calls this at
        start, before it serves: its live sessions are in memory, so any open session in the
        store is one of a previous process. Replicas sharing the database end only sessions
        whose last call is older than ``last_call_before`` (no live replica holds those)."""
        now = as_utc(at)
        open_ = [SessionRow.state != "ended"]
        if last_call_before is not None:
            open_.append(SessionRow.last_call_at < as_utc(last_call_before))
        async with self._sessionmaker() as db, db.begin():
            keys = select(SessionRow.session_id).where(*open_)
            await db.execute(
                update(ReservationRow)
                .where(ReservationRow.released_at.is_(None), ReservationRow.session_id.in_(keys))
                .values(released_at=now, release_reason=reason)
            )
            ended = await db.execute(
                update(SessionRow)
                .where(*open_)
                .values(state="ended", ended_at=now, end_reason=reason)
            )
            return int(getattr(ended, "rowcount", 0) or 0)

    # -- replicas sharing the database, drained instances ----------------------------------

    async def heartbeat_replica(
        self, name: str, url: str, started_at: datetime, at: datetime
    ) -> None:
        """Record that replica ``name`` (reached at ``url``) is alive at ``at``."""
        async with self._sessionmaker() as db, db.begin():
            await db.merge(
                ReplicaRow(
                    name=name, url=url, started_at=as_utc(started_at), last_seen_at=as_utc(at)
                )
            )

    async def live_replicas(self, seen_since: datetime) -> list[tuple[str, str]]:
        """(name, url) of the replicas heard from since ``seen_since``, by name."""
        query = (
            select(ReplicaRow.name, ReplicaRow.url)
            .where(ReplicaRow.last_seen_at >= as_utc(seen_since))
            .order_by(ReplicaRow.name)
        )
        async with self._sessionmaker() as db:
            return [(name, url) for name, url in (await db.execute(query)).all()]

    async def remove_replica(self, name: str) -> None:
        async with self._sessionmaker() as db, db.begin():
            await db.execute(delete(ReplicaRow).where(ReplicaRow.name == name))

    async def set_drain(self, name: str, draining: bool, at: datetime) -> None:
        """Mark runtime instance ``name`` drained (or not)."""
        async with self._sessionmaker() as db, db.begin():
            if draining:
                await db.merge(DrainRow(name=name, since=as_utc(at)))
            else:
                await db.execute(delete(DrainRow).where(DrainRow.name == name))

    async def drained(self) -> set[str]:
        """The runtime instances being drained."""
        async with self._sessionmaker() as db:
            return set(await db.scalars(select(DrainRow.name)))

    async def end_session(self, session_id: str, reason: str, at: datetime) -> bool:
        """End one stored session that is not ended (the admin's end of a session no proxy
        holds live): ``session_id`` is its key, or a client's id that only one open session
        has (``ValueError`` when several have it). False if there is no such open session."""
        now = as_utc(at)
        async with self._sessionmaker() as db, db.begin():
            row = await db.get(SessionRow, session_id)
            if row is None:
                query = select(SessionRow).where(
                    SessionRow.external_id == session_id, SessionRow.state != "ended"
                )
                rows = list(await db.scalars(query.limit(2)))
                if len(rows) > 1:
                    raise ValueError(f"several open sessions have the client id {session_id!r}")
                row = rows[0] if rows else None
            if row is None or row.state == "ended":
                return False
            session_id = row.session_id
            row.state, row.ended_at, row.end_reason = "ended", now, reason
            await db.execute(
                update(ReservationRow)
                .where(
                    ReservationRow.session_id == session_id, ReservationRow.released_at.is_(None)
                )
                .values(released_at=now, release_reason=reason)
            )
            return True

    # -- dead letters ---------------------------------------------------------------------

    async def write_dead_letter(self, kind: str, payload: str, error: str, at: datetime) -> None:
        """Keep a refused record (``payload``: its JSON, ASCII only)."""
        if self._guard is not None:
            self._guard.check()
        async with self._sessionmaker() as db, db.begin():
            db.add(DeadLetter(created_at=at, kind=kind, payload=payload, error=error))

    async def list_dead_letters(self, limit: int = 100) -> list[DeadLetterView]:
        """The newest dead letters first."""
        query = select(DeadLetter).order_by(DeadLetter.id.desc()).limit(limit)
        async with self._sessionmaker() as db:
            return [
                DeadLetterView(r.id, as_utc(r.created_at), r.kind, r.payload, r.error)
                for r in await db.scalars(query)
            ]

    # -- sessions -------------------------------------------------------------------------

    async def get_session(
        self, session_id: str, tenant_id: str | None = None
    ) -> SessionDetail | None:
        """The session and everything recorded about it: ``session_id`` is the proxy's key, or
        the client's id (its newest session without a parent then). ``tenant_id``: a tenant's
        id or name. None if there is no such session, or it belongs to another tenant than
        ``tenant_id`` (when given). A client's id that sessions of several tenants use, with
        no ``tenant_id``, raises :class:`AmbiguousSession` (it would be a guess which)."""
        async with self._sessionmaker() as db:
            tenants = None if tenant_id is None else await _tenant_ids(db, tenant_id)
            row = await db.get(SessionRow, session_id)
            if row is None:  # the client's id: its newest session
                query = select(SessionRow).where(SessionRow.external_id == session_id)
                if tenants is not None:
                    query = query.where(SessionRow.tenant_id.in_(tenants))
                else:
                    await _one_tenant_uses(db, session_id)
                query = query.order_by(  # its newest root, not one of its children
                    SessionRow.parent_session_id.is_not(None),
                    SessionRow.started_at.desc(),
                    SessionRow.session_id.desc(),
                )
                row = await db.scalar(query.limit(1))
            if row is None or (tenants is not None and row.tenant_id not in tenants):
                return None
            session_id = row.session_id
            calls = await db.scalars(
                select(CallRow)
                .where(CallRow.session_id == session_id)
                .order_by(CallRow.call_index, CallRow.arrived_at, CallRow.request_id)
            )
            decisions = await db.scalars(
                select(DecisionRow)
                .where(DecisionRow.session_id == session_id)
                .order_by(DecisionRow.created_at, DecisionRow.id)
            )
            reservations = await db.scalars(
                select(ReservationRow)
                .where(ReservationRow.session_id == session_id)
                .order_by(ReservationRow.created_at, ReservationRow.reservation_id)
            )
            hints = await db.scalars(
                select(HintRow)
                .where(HintRow.session_id == session_id)
                .order_by(HintRow.at, HintRow.id)
            )
            children = await db.scalars(
                select(SessionRow)
                .where(SessionRow.parent_session_id == session_id)
                .order_by(SessionRow.started_at, SessionRow.session_id)
            )
            return SessionDetail(
                session=session_view(row),
                calls=tuple(call_view(c) for c in calls),
                decisions=tuple(decision_view(d) for d in decisions),
                reservations=tuple(reservation_view(r) for r in reservations),
                hints=tuple(hint_view(h) for h in hints),
                children=tuple(session_view(c) for c in children),
            )

    async def list_sessions(
        self,
        *,
        state: str | None = None,
        model: str | None = None,
        tenant_id: str | None = None,
        started_after: datetime | None = None,
        started_before: datetime | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> SessionPage:
        """Sessions newest first, ordered by (started_at desc, session_id desc), ``limit`` at a
        time (1..1000). ``state`` is one of ``SESSION_STATES``; ``tenant_id`` is a tenant's id
        or its name. ``started_after`` is inclusive and ``started_before`` exclusive. Pass a
        page's ``next_cursor`` (with the same filters) for the next page. ``ValueError`` for an
        unknown state, a bad limit or an invalid cursor."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        where: list[ColumnElement[bool]] = []
        if state is not None:
            if state not in SESSION_STATES:
                raise ValueError(f"state must be one of {', '.join(SESSION_STATES)}, got {state!r}")
            where.append(SessionRow.state == state)
        if model is not None:
            where.append(SessionRow.model == model)
        if tenant_id is not None:
            named = select(Tenant.id).where(Tenant.name == tenant_id).scalar_subquery()
            where.append(or_(SessionRow.tenant_id == tenant_id, SessionRow.tenant_id == named))
        if started_after is not None:
            where.append(SessionRow.started_at >= as_utc(started_after))
        if started_before is not None:
            where.append(SessionRow.started_at < as_utc(started_before))
        if cursor is not None:
            at, sid = decode_cursor(cursor)
            where.append(
                or_(
                    SessionRow.started_at < at,
                    and_(SessionRow.started_at == at, SessionRow.session_id < sid),
                )
            )
        query = (
            select(SessionRow)
            .where(*where)
            .order_by(SessionRow.started_at.desc(), SessionRow.session_id.desc())
            .limit(limit + 1)
        )
        async with self._sessionmaker() as db:
            rows = list(await db.scalars(query))
        items = tuple(session_view(r) for r in rows[:limit])
        more = len(rows) > limit
        last = items[-1] if items else None
        next_cursor = encode_cursor(last.started_at, last.session_id) if more and last else None
        return SessionPage(items=items, next_cursor=next_cursor)

    async def open_root_session(
        self, tenant_id: str, external_id: str
    ) -> tuple[SessionSummary, str | None] | None:
        """The tenant's latest open root session that the client calls ``external_id``, and
        the instance of its latest call; None if there is none."""
        query = (
            select(SessionRow)
            .where(
                SessionRow.tenant_id == tenant_id,
                SessionRow.external_id == external_id,
                SessionRow.parent_session_id.is_(None),
                SessionRow.state != "ended",
            )
            .order_by(SessionRow.last_call_at.desc())
            .limit(1)
        )
        async with self._sessionmaker() as db:
            row = await db.scalar(query)
            if row is None:
                return None
            summary = session_view(row)
        instances = await self.last_instances([summary.session_id])
        return summary, instances.get(summary.session_id)

    async def last_instances(self, session_ids: Sequence[str]) -> dict[str, str | None]:
        """The instance of each session's latest call (sessions without calls are absent)."""
        if not session_ids:
            return {}
        latest = (
            select(CallRow.session_id, func.max(CallRow.call_index).label("call_index"))
            .where(CallRow.session_id.in_(session_ids))
            .group_by(CallRow.session_id)
            .subquery()
        )
        query = select(CallRow.session_id, CallRow.instance).join(
            latest,
            and_(
                CallRow.session_id == latest.c.session_id,
                CallRow.call_index == latest.c.call_index,
            ),
        )
        async with self._sessionmaker() as db:
            return {sid: instance for sid, instance in (await db.execute(query)).all()}

    async def list_instances(self) -> list[InstanceRecord]:
        """Every runtime instance the gateway has seen, by name."""
        async with self._sessionmaker() as db:
            rows = await db.scalars(select(InstanceRow).order_by(InstanceRow.name))
            return [instance_view(r) for r in rows]

    # -- stored responses (Responses API) -------------------------------------------------

    async def get_response(
        self, tenant_id: str, response_id: str, now: datetime
    ) -> StoredResponseView | None:
        """The tenant's stored response, unless it expired (or belongs to another tenant)."""
        async with self._sessionmaker() as db:
            row = await db.get(StoredResponse, response_id)
            if row is None or row.tenant_id != tenant_id or row.expires_at <= as_utc(now):
                return None
            return StoredResponseView(row.response_id, dict(row.response), list(row.input_items))

    async def delete_response(self, tenant_id: str, response_id: str) -> int | None:
        """Delete the tenant's stored response; returns its ``size_bytes`` (None: it has no
        such response)."""
        async with self._sessionmaker() as db, db.begin():
            row = await db.get(StoredResponse, response_id)
            if row is None or row.tenant_id != tenant_id:
                return None
            await db.delete(row)
            return row.size_bytes

    async def response_bytes(self, now: datetime) -> dict[str, tuple[int, datetime]]:
        """Per tenant, ``SUM(size_bytes)`` of its stored responses not expired by ``now``
        and the earliest ``expires_at`` among them (tenants without any are absent). Reads
        only the index on (tenant_id, expires_at, size_bytes)."""
        query = (
            select(
                StoredResponse.tenant_id,
                func.sum(StoredResponse.size_bytes),
                func.min(StoredResponse.expires_at),
            )
            .where(StoredResponse.expires_at > as_utc(now))
            .group_by(StoredResponse.tenant_id)
        )
        async with self._sessionmaker() as db:
            rows = (await db.execute(query)).all()
        return {tenant: (int(total), as_utc(oldest)) for tenant, total, oldest in rows}

    async def purge_responses(self, now: datetime) -> int:
        """Delete every stored response that expired by ``now``; returns how many."""
        async with self._sessionmaker() as db, db.begin():
            result = await db.execute(
                delete(StoredResponse).where(StoredResponse.expires_at <= as_utc(now))
            )
            return int(getattr(result, "rowcount", 0) or 0)

    # -- tenants and API keys -------------------------------------------------------------

    async def create_tenant(self, name: str) -> str:
        """The id of the tenant called ``name``, created if there is none (idempotent)."""
        async with self._sessionmaker() as db:
            existing = await db.scalar(select(Tenant.id).where(Tenant.name == name))
            if existing is not None:
                return existing
            tenant_id = uuid.uuid4().hex
            db.add(Tenant(id=tenant_id, name=name, created_at=datetime.now(UTC)))
            try:
                await db.commit()
            except IntegrityError:  # created concurrently under the same name
                await db.rollback()
                raced = await db.scalar(select(Tenant.id).where(Tenant.name == name))
                if raced is None:
                    raise
                return raced
            return tenant_id

    async def create_api_key(self, tenant_id: str) -> str:
        """A new key for ``tenant_id``: the plaintext is returned here, once; only its hash is
        stored. ``ValueError`` if the tenant does not exist."""
        plaintext = API_KEY_PREFIX + secrets.token_urlsafe(32)
        async with self._sessionmaker() as db, db.begin():
            if await db.get(Tenant, tenant_id) is None:
                raise ValueError(f"no tenant with id {tenant_id!r}")
            db.add(
                ApiKey(
                    id=uuid.uuid4().hex,
                    tenant_id=tenant_id,
                    key_hash=hash_key(plaintext),
                    prefix=plaintext[:8],
                    created_at=datetime.now(UTC),
                    revoked_at=None,
                )
            )
        return plaintext

    async def tenant_for_key(self, plaintext: str) -> str | None:
        """The tenant of an unrevoked key, or None."""
        async with self._sessionmaker() as db:
            return await db.scalar(
                select(ApiKey.tenant_id).where(
                    ApiKey.key_hash == hash_key(plaintext), ApiKey.revoked_at.is_(None)
                )
            )

    async def list_api_keys(
        self, tenant_id: str | None = None, *, include_deleted: bool = False
    ) -> list[ApiKeyInfo]:
        """Keys (without secrets) with their tenant's name, oldest first, optionally of one
        tenant; deleted keys only with ``include_deleted`` (marked ``deleted``)."""
        query = (
            select(ApiKey, Tenant.name)
            .join(Tenant, Tenant.id == ApiKey.tenant_id)
            .order_by(ApiKey.created_at, ApiKey.id)
        )
        if tenant_id is not None:
            query = query.where(ApiKey.tenant_id == tenant_id)
        if not include_deleted:
            query = query.where(ApiKey.key_hash.not_like(DELETED_KEY_HASH_PREFIX + "%"))
        async with self._sessionmaker() as db:
            return [
                replace(
                    key_view(row),
                    tenant_name=name,
                    deleted=row.key_hash.startswith(DELETED_KEY_HASH_PREFIX),
                )
                for row, name in await db.execute(query)
            ]

    async def revoke_api_key(self, key_id: str) -> bool:
        """Revoke a key by id; False if there is no such key or it was already revoked."""
        async with self._sessionmaker() as db, db.begin():
            row = await db.get(ApiKey, key_id)
            if row is None or row.revoked_at is not None:
                return False
            row.revoked_at = datetime.now(UTC)
            return True

    async def delete_api_key(self, key_id: str) -> bool:
        """Delete a key by id, as a tombstone: the row stays (revoked, its hash replaced by
        ``deleted:<id>``, which no key hashes to), so it still counts in
        :meth:`count_api_keys`. False if there is no such key or it was deleted already."""
        async with self._sessionmaker() as db, db.begin():
            row = await db.get(ApiKey, key_id)
            if row is None or row.key_hash.startswith(DELETED_KEY_HASH_PREFIX):
                return False
            row.key_hash = DELETED_KEY_HASH_PREFIX + row.id
            if row.revoked_at is None:
                row.revoked_at = datetime.now(UTC)
            return True

    async def count_api_keys(self, *, active_only: bool = False) -> int:
        """How many keys were ever created, revoked and deleted ones included (so revoking or
        deleting the last key does not turn "no keys" open access back on); ``active_only``
        counts usable keys."""
        query = select(func.count()).select_from(ApiKey)
        if active_only:
            query = query.where(ApiKey.revoked_at.is_(None))
        async with self._sessionmaker() as db:
            return int(await db.scalar(query) or 0)


class AmbiguousSession(ValueError):
    """A client's session id that sessions of several tenants use: ``tenants`` lists each as
    (id, name)."""

    def __init__(self, external_id: str, tenants: list[tuple[str, str | None]]) -> None:
        named = ", ".join(f"{name} (id {tid})" if name else tid for tid, name in tenants)
        super().__init__(
            f"The client id {external_id!r} is used by sessions of {len(tenants)} tenants: {named}"
        )
        self.tenants = tenants


async def _tenant_ids(db: AsyncSession, tenant: str) -> set[str]:
    """The ids ``tenant`` names: itself, and the id of the tenant so named."""
    named = await db.scalar(select(Tenant.id).where(Tenant.name == tenant))
    return {tenant} if named is None else {tenant, named}


async def _one_tenant_uses(db: AsyncSession, external_id: str) -> None:
    """Raise :class:`AmbiguousSession` when sessions of several tenants have ``external_id``."""
    rows = await db.execute(
        select(SessionRow.tenant_id, Tenant.name)
        .outerjoin(Tenant, Tenant.id == SessionRow.tenant_id)
        .where(SessionRow.external_id == external_id)
        .distinct()
        .order_by(Tenant.name, SessionRow.tenant_id)
    )
    tenants: list[tuple[str, str | None]] = [(tid, name) for tid, name in rows]
    if len(tenants) > 1:
        raise AmbiguousSession(external_id, tenants)
