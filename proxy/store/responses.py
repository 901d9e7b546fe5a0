"""``ResponseTables``: the stored responses of the Responses API (``responses``): reads,
deletes, the storage quota's totals and the purge of expired ones. Their rows are written by the
batched writer (``batch.py``); proxy/dialects/responses/store.py is their user."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, func, select

from talaria.proxy.store.db import TableGroup
from talaria.proxy.store.mapping import from_row
from talaria.proxy.store.models import StoredResponse, as_utc
from talaria.proxy.store.views import StoredResponseView


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
