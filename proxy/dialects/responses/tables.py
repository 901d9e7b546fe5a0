"""The Responses dialect's own table in the store (``responses``): its rows (``StoredResponse``,
on the store's declarative ``Base``, so the migrations and the schema check see it once the
dialects are imported: migrations/env.py), the record the call path writes (``ResponseRecord``:
the batched writer upserts it by id within its tenant, proxy/store/batch.py), the view a
continuation reads (``StoredResponseView``), and its reads, deletes, quota totals and purge
(``ResponseTables``). store.py is their user."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, BigInteger, Index, String, delete, func, select
from sqlalchemy.orm import Mapped, mapped_column

from talaria.proxy.contract.records import TableRecord
from talaria.proxy.store.db import TableGroup
from talaria.proxy.store.mapping import from_row
from talaria.proxy.store.models import Base, as_utc


class StoredResponse(Base):
    """A response of the Responses API kept for ``previous_response_id`` and
    ``GET /v1/responses/{id}``: the response object as returned, and its input items expanded
    through its predecessors (so a continuation reads one row). Kept until ``expires_at``;
    ``store: false`` keeps nothing. ``size_bytes`` is what the row counts against its tenant's
    storage quota (proxy/dialects/responses/quota.py); the index on (tenant, expiry, size) holds
    everything the quota's ``SUM`` per tenant reads, so that query never touches the JSON."""

    __tablename__ = "responses"
    __table_args__ = (
        Index(
            "ix_responses_tenant_id_expires_at_size_bytes",
            "tenant_id",
            "expires_at",
            "size_bytes",
        ),
    )

    response_id: Mapped[str] = mapped_column(String, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String, index=True)
    session_key: Mapped[str] = mapped_column(String)
    model: Mapped[str] = mapped_column(String)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime] = mapped_column(index=True)
    response: Mapped[dict[str, Any]]
    input_items: Mapped[list[Any]] = mapped_column(JSON)
    size_bytes: Mapped[int] = mapped_column(BigInteger, server_default="0")


@dataclass(frozen=True)
class ResponseRecord(TableRecord):
    """A stored response of the Responses API (upserted by id within its tenant)."""

    ROW: ClassVar[Any] = StoredResponse
    KEY: ClassVar[str] = "response_id"
    OWNER: ClassVar[str] = "tenant_id"

    response_id: str
    tenant_id: str
    session_key: str
    model: str
    created_at: datetime
    expires_at: datetime
    response: dict[str, Any]
    """The response object as the client got it."""
    input_items: list[Any]
    """Its input items, expanded through ``previous_response_id`` (each with an ``id``)."""
    size_bytes: int
    """The encoded size of all its fields (quota.py ``stored_bytes``): what it counts against
    its tenant's storage quota."""


@dataclass(frozen=True)
class StoredResponseView:
    """A stored response as a continuation reads it: the response and its input items."""

    response_id: str
    response: dict[str, Any]
    input_items: list[Any]


class ResponseTables(TableGroup):
    """Stored responses, each owned by one tenant."""

    async def get_response(
        self, tenant_id: str, response_id: str, now: datetime
    ) -> StoredResponseView | None:
        """The tenant's stored response, unless it expired (or belongs to another tenant)."""
        async with self._sessionmaker() as db:
            row = await db.get(StoredResponse, response_id)
            if row is None or row.tenant_id != tenant_id or row.expires_at <= as_utc(now):
                return None
            return from_row(StoredResponseView, row)

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
