"""Stored responses of the Responses API, for ``previous_response_id`` and
``GET``/``DELETE /v1/responses/{id}``.

What is kept, per tenant, for ``ttl_s`` (``TALARIA_RESPONSES_TTL_S``, default 7 days): the
response object as returned (its output items, usage, parameters) and its input items expanded
through its predecessors, so that a continuation reads one row. Nothing is kept for a request
with ``store: false`` (what Codex sends), nor for any request when
``TALARIA_STORE_RESPONSES=false``.

The record is committed with the call's own records (the gateway submits it); the most recent
responses are also kept in memory (``cache_size``), so a client that continues at once never
waits for the writer, and a lookup that misses the cache flushes the writer before it reads.
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from typing import Any

from talaria.proxy.records import ResponseRecord
from talaria.proxy.store.repository import SqlStore
from talaria.proxy.store.views import StoredResponseView
from talaria.proxy.store.writer import BatchWriter

DEFAULT_TTL_S = 7 * 24 * 3600.0


class ResponseStore:
    def __init__(
        self,
        writer: BatchWriter,
        store: SqlStore,
        *,
        enabled: bool = True,
        ttl_s: float = DEFAULT_TTL_S,
        cache_size: int = 256,
    ) -> None:
        self.enabled = enabled
        self._writer = writer
        self._store = store
        self._ttl = timedelta(seconds=ttl_s)
        self._cache_size = cache_size
        self._cache: OrderedDict[str, tuple[ResponseRecord, bool]] = OrderedDict()
        """id → (record, deleted)."""

    def prepare(
        self,
        *,
        tenant_id: str,
        session_id: str,
        response: dict[str, Any],
        input_items: list[Any],
    ) -> ResponseRecord:
        """The record that keeps ``response`` (the gateway commits it with the call's own
        records); remembered in memory at once."""
        now = datetime.now(UTC)
        record = ResponseRecord(
            response_id=str(response["id"]),
            tenant_id=tenant_id,
            session_id=session_id,
            model=str(response["model"]),
            created_at=now,
            expires_at=now + self._ttl,
            response=response,
            input_items=input_items,
        )
        self._remember(record, deleted=False)
        return record

    async def load(self, tenant_id: str, response_id: str) -> StoredResponseView | None:
        now = datetime.now(UTC)
        cached = self._cache.get(response_id)
        if cached is not None:
            record, deleted = cached
            if deleted or record.tenant_id != tenant_id or record.expires_at <= now:
                return None
            return StoredResponseView(response_id, record.response, record.input_items)
        await self._writer.flush()
        return await self._store.get_response(tenant_id, response_id, now)

    async def delete(self, tenant_id: str, response_id: str) -> bool:
        if await self.load(tenant_id, response_id) is None:
            return False
        await self._writer.flush()
        deleted = await self._store.delete_response(tenant_id, response_id)
        cached = self._cache.get(response_id)
        if cached is not None:
            self._cache[response_id] = (cached[0], True)
        return deleted

    async def purge(self) -> int:
        """Delete what expired (the store's rows; the cache drops expired entries as read)."""
        return await self._store.purge_responses(datetime.now(UTC))

    def _remember(self, record: ResponseRecord, deleted: bool) -> None:
        self._cache[record.response_id] = (record, deleted)
        self._cache.move_to_end(record.response_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
