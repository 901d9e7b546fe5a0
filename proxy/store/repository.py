"""``SqlStore``: the session store's reads and writes over an ``async_sessionmaker``.

Writes arrive in batches from the :class:`~talaria.proxy.store.writer.BatchWriter` (see
``batch.py`` for how each record becomes rows); reads return the frozen views of ``views.py``.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import ColumnElement, and_, delete, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from talaria.proxy.records import InstanceRecord, Record
from talaria.proxy.store.batch import apply_batch
from talaria.proxy.store.models import (
    ApiKey,
    CallRow,
    DecisionRow,
    HintRow,
    InstanceRow,
    ReservationRow,
    SessionRow,
    StoredResponse,
    Tenant,
    as_utc,
)
from talaria.proxy.store.views import (
    ApiKeyInfo,
    SessionDetail,
    SessionPage,
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
MAX_PAGE = 1000


def hash_key(plaintext: str) -> str:
    """The stored form of an API key: SHA-256, hex."""
    return hashlib.sha256(plaintext.encode()).hexdigest()


class SqlStore:
    """Sessions, calls, routing decisions, reservations, hints, instances, tenants, API keys."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession]) -> None:
        self._sessionmaker = sessionmaker

    async def write_batch(self, records: Sequence[Record]) -> None:
        """Apply ``records`` in order, in one transaction (all or nothing). Safe to retry."""
        if not records:
            return
        async with self._sessionmaker() as db, db.begin():
            await apply_batch(db, records)

    # -- sessions -------------------------------------------------------------------------

    async def get_session(
        self, session_id: str, tenant_id: str | None = None
    ) -> SessionDetail | None:
        """The session and everything recorded about it: ``session_id`` is the proxy's key, or
        the client's id (its newest session without a parent then). None if there is no such
        session, or it belongs to another tenant than ``tenant_id`` (when given)."""
        async with self._sessionmaker() as db:
            row = await db.get(SessionRow, session_id)
            if row is None:  # the client's id: its newest session
                query = select(SessionRow).where(SessionRow.external_id == session_id)
                if tenant_id is not None:
                    query = query.where(SessionRow.tenant_id == tenant_id)
                query = query.order_by(  # its newest root, not one of its children
                    SessionRow.parent_session_id.is_not(None),
                    SessionRow.started_at.desc(),
                    SessionRow.session_id.desc(),
                )
                row = await db.scalar(query.limit(1))
            if row is None or (tenant_id is not None and row.tenant_id != tenant_id):
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
        time (1..1000). ``started_after`` is inclusive and ``started_before`` exclusive. Pass a
        page's ``next_cursor`` (with the same filters) for the next page; an invalid cursor
        raises ``ValueError``."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        where: list[ColumnElement[bool]] = []
        if state is not None:
            where.append(SessionRow.state == state)
        if model is not None:
            where.append(SessionRow.model == model)
        if tenant_id is not None:
            where.append(SessionRow.tenant_id == tenant_id)
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

    async def delete_response(self, tenant_id: str, response_id: str) -> bool:
        async with self._sessionmaker() as db, db.begin():
            row = await db.get(StoredResponse, response_id)
            if row is None or row.tenant_id != tenant_id:
                return False
            await db.delete(row)
            return True

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

    async def list_api_keys(self, tenant_id: str | None = None) -> list[ApiKeyInfo]:
        """Keys (without secrets), oldest first, optionally of one tenant."""
        query = select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)
        if tenant_id is not None:
            query = query.where(ApiKey.tenant_id == tenant_id)
        async with self._sessionmaker() as db:
            return [key_view(r) for r in await db.scalars(query)]

    async def revoke_api_key(self, key_id: str) -> bool:
        """Revoke a key by id; False if there is no such key or it was already revoked."""
        async with self._sessionmaker() as db, db.begin():
            row = await db.get(ApiKey, key_id)
            if row is None or row.revoked_at is not None:
                return False
            row.revoked_at = datetime.now(UTC)
            return True

    async def count_api_keys(self, *, active_only: bool = False) -> int:
        """How many keys were ever created, revoked ones included (so revoking the last key
        does not turn "no keys" open access back on); ``active_only`` counts usable keys."""
        query = select(func.count()).select_from(ApiKey)
        if active_only:
            query = query.where(ApiKey.revoked_at.is_(None))
        async with self._sessionmaker() as db:
            return int(await db.scalar(query) or 0)
