"""``SessionTables``: the sessions and what is recorded with them (calls, routing decisions,
reservations, hints): the admin's reads, the ends of sessions no proxy holds live, and the
lookups a replica needs to adopt a session. Their rows are written by the batched writer
(``batch.py``); reads return the views of ``views.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import ColumnElement, and_, exists, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from talaria.proxy.contract.records import (
    CallRecord,
    DecisionRecord,
    HintRecord,
    ReservationRecord,
    SessionRecord,
)
from talaria.proxy.store.claims import claimed_row, lock_name
from talaria.proxy.store.db import TableGroup
from talaria.proxy.store.mapping import from_row
from talaria.proxy.store.models import (
    CallRow,
    DecisionRow,
    HintRow,
    ReservationRow,
    SessionRow,
    Tenant,
    as_utc,
)
from talaria.proxy.store.views import (
    Family,
    SessionDetail,
    SessionPage,
    SessionSummary,
    decode_cursor,
    encode_cursor,
)

SESSION_STATES = ("active", "in_tool", "ended")
MAX_PAGE = 1000


class AmbiguousSession(ValueError):
    """A client's session id (``session_id``) that sessions of several tenants use: ``tenants``
    lists each as (id, name)."""

    def __init__(self, session_id: str, tenants: list[tuple[str, str | None]]) -> None:
        named = ", ".join(f"{name} (id {tid})" if name else tid for tid, name in tenants)
        super().__init__(
            f"The client id {session_id!r} is used by sessions of {len(tenants)} tenants: {named}"
        )
        self.tenants = tenants


class SessionTables(TableGroup):
    """Reads of ``sessions`` with their ``calls``, ``routing_decisions``, ``reservations``
    and ``hints``; ends of stored sessions (which release their reservations)."""

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
            keys = select(SessionRow.session_key).where(*open_)
            await db.execute(
                update(ReservationRow)
                .where(ReservationRow.released_at.is_(None), ReservationRow.session_key.in_(keys))
                .values(released_at=now, release_reason=reason)
            )
            ended = await db.execute(
                update(SessionRow)
                .where(*open_)
                .values(state="ended", ended_at=now, end_reason=reason)
            )
            return int(getattr(ended, "rowcount", 0) or 0)

    async def end_session(self, key_or_id: str, reason: str, at: datetime) -> SessionSummary | None:
        """End one stored session that is not ended (the admin's end of a session no proxy
        holds live): ``key_or_id`` is its key, or a client's id that only one open session
        has (``ValueError`` when several have it). The session as ended, or None if there is
        no such open session."""
        now = as_utc(at)
        async with self._sessionmaker() as db, db.begin():
            row = await db.get(SessionRow, key_or_id)
            if row is None:
                query = select(SessionRow).where(
                    SessionRow.session_id == key_or_id, SessionRow.state != "ended"
                )
                rows = list(await db.scalars(query.limit(2)))
                if len(rows) > 1:
                    raise ValueError(f"several open sessions have the client id {key_or_id!r}")
                row = rows[0] if rows else None
            if row is None or row.state == "ended":
                return None
            row.state, row.ended_at, row.end_reason = "ended", now, reason
            await db.execute(
                update(ReservationRow)
                .where(
                    ReservationRow.session_key == row.session_key,
                    ReservationRow.released_at.is_(None),
                )
                .values(released_at=now, release_reason=reason)
            )
            return from_row(SessionSummary, row)

    async def get_session(
        self, key_or_id: str, tenant_id: str | None = None
    ) -> SessionDetail | None:
        """The session and everything recorded about it: ``key_or_id`` is the proxy's key, or
        the client's id (its newest session without a parent then). ``tenant_id``: a tenant's
        id or name. None if there is no such session, or it belongs to another tenant than
        ``tenant_id`` (when given). A client's id that sessions of several tenants use, with
        no ``tenant_id``, raises :class:`AmbiguousSession` (it would be a guess which)."""
        async with self._sessionmaker() as db:
            tenants = None if tenant_id is None else await _tenant_ids(db, tenant_id)
            row = await db.get(SessionRow, key_or_id)
            if row is None:  # the client's id: its newest session
                query = select(SessionRow).where(SessionRow.session_id == key_or_id)
                if tenants is not None:
                    query = query.where(SessionRow.tenant_id.in_(tenants))
                else:
                    await _one_tenant_uses(db, key_or_id)
                query = query.order_by(  # its newest root, not one of its children
                    SessionRow.parent_session_key.is_not(None),
                    SessionRow.started_at.desc(),
                    SessionRow.session_key.desc(),
                )
                row = await db.scalar(query.limit(1))
            if row is None or (tenants is not None and row.tenant_id not in tenants):
                return None
            session_key = row.session_key
            calls = await db.scalars(
                select(CallRow)
                .where(CallRow.session_key == session_key)
                .order_by(CallRow.call_index, CallRow.arrived_at, CallRow.request_id)
            )
            decisions = await db.scalars(
                select(DecisionRow)
                .where(DecisionRow.session_key == session_key)
                .order_by(DecisionRow.created_at, DecisionRow.id)
            )
            reservations = await db.scalars(
                select(ReservationRow)
                .where(ReservationRow.session_key == session_key)
                .order_by(ReservationRow.created_at, ReservationRow.reservation_id)
            )
            hints = await db.scalars(
                select(HintRow)
                .where(HintRow.session_key == session_key)
                .order_by(HintRow.at, HintRow.id)
            )
            children = await db.scalars(
                select(SessionRow)
                .where(
                    SessionRow.parent_session_key == session_key,
                    SessionRow.tenant_id == row.tenant_id,
                )
                .order_by(SessionRow.started_at, SessionRow.session_key)
            )
            return SessionDetail(
                session=from_row(SessionSummary, row),
                calls=tuple(from_row(CallRecord, c) for c in calls),
                decisions=tuple(from_row(DecisionRecord, d) for d in decisions),
                reservations=tuple(from_row(ReservationRecord, r) for r in reservations),
                hints=tuple(from_row(HintRecord, h) for h in hints),
                children=tuple(from_row(SessionSummary, c) for c in children),
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
        roots: bool = True,
    ) -> SessionPage:
        """Sessions newest first, ordered by (started_at desc, session_key desc), ``limit`` at a
        time (1..1000): with ``roots``, only root sessions (no parent, or no parent of the
        same tenant in the store), whose families :meth:`families` sums.
        ``state`` is one of ``SESSION_STATES``; ``tenant_id`` is a tenant's id or its name.
        ``started_after`` is inclusive and ``started_before`` exclusive. Pass a page's
        ``next_cursor`` (with the same filters) for the next page. ``ValueError`` for an
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
        if roots:
            parent = aliased(SessionRow)
            held = exists().where(
                parent.session_key == SessionRow.parent_session_key,
                parent.tenant_id == SessionRow.tenant_id,
            )
            where.append(or_(SessionRow.parent_session_key.is_(None), ~held))
        if cursor is not None:
            at, sid = decode_cursor(cursor)
            where.append(
                or_(
                    SessionRow.started_at < at,
                    and_(SessionRow.started_at == at, SessionRow.session_key < sid),
                )
            )
        query = (
            select(SessionRow)
            .where(*where)
            .order_by(SessionRow.started_at.desc(), SessionRow.session_key.desc())
            .limit(limit + 1)
        )
        async with self._sessionmaker() as db:
            rows = list(await db.scalars(query))
        items = tuple(from_row(SessionSummary, r) for r in rows[:limit])
        more = len(rows) > limit
        last = items[-1] if items else None
        next_cursor = encode_cursor(last.started_at, last.session_key) if more and last else None
        return SessionPage(items=items, next_cursor=next_cursor)

    async def families(self, root_keys: Sequence[str]) -> dict[str, Family]:
        """Each root's family (views.Family): the root and every session of the root's tenant
        whose parent is in the family, found with one recursive query for all of
        ``root_keys``."""
        if not root_keys:
            return {}
        tree = (
            select(
                SessionRow.session_key.label("root"),
                SessionRow.session_key.label("key"),
                SessionRow.tenant_id.label("tenant"),
            )
            .where(SessionRow.session_key.in_(root_keys))
            .cte("family_tree", recursive=True)
        )
        child = aliased(SessionRow)
        tree = tree.union(  # a union, not union all: it ends even on a cycle of parents
            select(tree.c.root, child.session_key, child.tenant_id).join(
                child,  # a family never crosses tenants (a parent is joined by key and tenant)
                and_(child.parent_session_key == tree.c.key, child.tenant_id == tree.c.tenant),
            )
        )
        member = aliased(SessionRow)
        query = (
            select(
                tree.c.root,
                func.count(),
                func.sum(member.calls),
                func.sum(member.prompt_tokens),
                func.sum(member.cached_tokens),
                func.sum(member.output_tokens),
                func.min(member.started_at),
                func.max(func.coalesce(member.ended_at, member.last_call_at)),
            )
            .join(member, member.session_key == tree.c.key)
            .group_by(tree.c.root)
        )
        async with self._sessionmaker() as db:
            rows = (await db.execute(query)).all()
        return {
            root: Family(
                sessions,
                calls or 0,
                prompt or 0,
                cached or 0,
                output or 0,
                (as_utc(last) - as_utc(first)).total_seconds(),
            )
            for root, sessions, calls, prompt, cached, output, first, last in rows
        }

    async def open_root_session(
        self, tenant_id: str, session_id: str, claim: SessionRecord | None = None
    ) -> tuple[SessionSummary, str | None] | None:
        """The tenant's latest open root session that the client calls ``session_id``, and
        the instance of its latest call; None if there is none. With ``claim`` (the record of
        a new session under that name), none open means ``claim``'s row is inserted now and
        returned: the store decides which replica's session the name is (claims.py)."""
        query = (
            select(SessionRow)
            .where(
                SessionRow.tenant_id == tenant_id,
                SessionRow.session_id == session_id,
                SessionRow.parent_session_key.is_(None),
                SessionRow.state != "ended",
            )
            .order_by(SessionRow.last_call_at.desc())
            .limit(1)
        )
        async with self._sessionmaker() as db, db.begin():
            if claim is not None:
                await lock_name(db, tenant_id, session_id)
            row = await db.scalar(query)
            if row is None and claim is not None:
                row = claimed_row(claim)
                db.add(row)
                await db.flush()
            if row is None:
                return None
            summary = from_row(SessionSummary, row)
        if claim is not None and summary.session_key == claim.session_key:
            return summary, None  # this claim's own: no call yet
        instances = await self.last_instances([summary.session_key])
        return summary, instances.get(summary.session_key)

    async def last_instances(self, session_keys: Sequence[str]) -> dict[str, str | None]:
        """The instance of each session's latest call, by key (sessions without calls are
        absent)."""
        if not session_keys:
            return {}
        latest = (
            select(CallRow.session_key, func.max(CallRow.call_index).label("call_index"))
            .where(CallRow.session_key.in_(session_keys))
            .group_by(CallRow.session_key)
            .subquery()
        )
        query = select(CallRow.session_key, CallRow.instance).join(
            latest,
            and_(
                CallRow.session_key == latest.c.session_key,
                CallRow.call_index == latest.c.call_index,
            ),
        )
        async with self._sessionmaker() as db:
            return {sid: instance for sid, instance in (await db.execute(query)).all()}


async def _tenant_ids(db: AsyncSession, tenant: str) -> set[str]:
    """The ids ``tenant`` names: itself, and the id of the tenant so named."""
    named = await db.scalar(select(Tenant.id).where(Tenant.name == tenant))
    return {tenant} if named is None else {tenant, named}


async def _one_tenant_uses(db: AsyncSession, session_id: str) -> None:
    """Raise :class:`AmbiguousSession` when sessions of several tenants have ``session_id``."""
    rows = await db.execute(
        select(SessionRow.tenant_id, Tenant.name)
        .outerjoin(Tenant, Tenant.id == SessionRow.tenant_id)
        .where(SessionRow.session_id == session_id)
        .distinct()
        .order_by(Tenant.name, SessionRow.tenant_id)
    )
    tenants: list[tuple[str, str | None]] = [(tid, name) for tid, name in rows]
    if len(tenants) > 1:
        raise AmbiguousSession(session_id, tenants)
