"""Stored responses of the Responses API, for ``previous_response_id`` and
``GET``/``DELETE /v1/responses/{id}``.

What is kept, per tenant, for ``ttl_s`` (``TALARIA_RESPONSES_TTL_S``, default 7 days): the
response object as returned (its output items, usage, parameters) and its input items expanded
through its predecessors, so that a continuation reads one row. Nothing is kept for a request
with ``store: false`` (what Codex sends), nor for any request when
``TALARIA_STORE_RESPONSES=false``.

Bounds: every stored response counts its bytes against its tenant's quota and a global cap
(proxy/dialects/responses/quota.py: a ``store: true`` call past either is refused with 429 before it
runs, by :meth:`ResponseStore.admit`); the totals are read from the store at start and every
``REFRESH_S``, and deletions and expiry free them.

The record is committed with the call's own records (the gateway submits it); the most recent
responses are also kept in memory, at most ``cache_size`` of them and ``cache_max_bytes`` of
their ``size_bytes`` (a response larger than that is not kept), so a client that continues
at once never waits for the writer, and a lookup that misses the cache flushes the writer
before it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from talaria.proxy.dialects.base import DialectSite
from talaria.proxy.dialects.responses.quota import (
    REFRESH_S,
    Hold,
    StorageQuota,
    json_bytes,
    stored_bytes,
)
from talaria.proxy.dialects.responses.settings import ResponsesSettings
from talaria.proxy.dialects.responses.tables import (
    ResponseRecord,
    ResponseTables,
    StoredResponseView,
)
from talaria.proxy.store.writer import BatchWriter

log = logging.getLogger("talaria.proxy.responses")

DEFAULT_TTL_S = 7 * 24 * 3600.0
PURGE_INTERVAL_S = 600.0
"""How often expired stored responses are deleted (wall seconds)."""
CACHE_SIZE = 256
CACHE_MAX_BYTES = 64 * 2**20
"""The cache serves continuations that arrive before the writer committed their predecessor
(a miss costs a flush and one row read, not an error), so it needs only the latest responses:
64 MiB holds the last 256 of 256 KiB (a long agent turn's items) and bounds what a tenant's
large responses can take of the proxy's memory (their Python objects take a small multiple of
the encoded bytes)."""


@dataclass
class Pending:
    """A ``store: true`` call admitted against the quota: its input items, measured."""

    tenant_id: str
    input_items: list[Any]
    input_bytes: int
    hold: Hold


class ResponseStore:
    """The stored responses of the Responses API: quota, in-memory cache and store reads
    (module docstring); ``ttl_s`` is wall seconds."""

    def __init__(
        self,
        writer: BatchWriter,
        store: ResponseTables,
        *,
        enabled: bool = True,
        ttl_s: float = DEFAULT_TTL_S,
        tenant_quota_bytes: int,
        max_bytes: int,
        cache_size: int = CACHE_SIZE,
        cache_max_bytes: int = CACHE_MAX_BYTES,
    ) -> None:
        self.enabled = enabled
        self._writer = writer
        self._store = store
        self._ttl = timedelta(seconds=ttl_s)
        self.quota = StorageQuota(tenant_quota_bytes, max_bytes)
        self._cache_size = cache_size
        self._cache_max_bytes = cache_max_bytes
        self._cache: OrderedDict[str, ResponseRecord] = OrderedDict()
        self._cache_bytes = 0
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    def of_site(cls, site: DialectSite) -> ResponseStore:
        """The Responses dialect's service (proxy/dialects/base.py): built from its settings
        (settings.py), the store's sessions and its writer."""
        cfg = ResponsesSettings.of(site.settings)
        return cls(
            site.writer,
            ResponseTables(site.store.sessionmaker),
            enabled=cfg.store_responses,
            ttl_s=cfg.responses_ttl_s,
            tenant_quota_bytes=cfg.responses_tenant_quota_bytes,
            max_bytes=cfg.responses_max_bytes,
        )

    @property
    def cache_bytes(self) -> int:
        """``size_bytes`` of the responses in memory."""
        return self._cache_bytes

    @property
    def cache_entries(self) -> int:
        """Responses in memory."""
        return len(self._cache)

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Read the quota's totals from the store (before serving), then every
        ``REFRESH_S``; delete expired responses every ``PURGE_INTERVAL_S`` (also when storing
        is off: what was kept before still expires)."""
        loop = asyncio.get_running_loop()
        if self.enabled:
            await self.refresh()
            self._tasks.append(loop.create_task(self._refresh_often()))
        self._tasks.append(loop.create_task(self._purge_often()))

    async def close(self) -> None:
        """Stop refreshing the quota's totals and purging."""
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def refresh(self) -> None:
        """The quota's totals from the store: every record submitted before is flushed first,
        so the totals include this process's additions up to the mark."""
        mark = self.quota.begin_refresh()
        await self._writer.flush()
        totals = await self._store.response_bytes(datetime.now(UTC))
        self.quota.finish_refresh(mark, totals)

    async def _refresh_often(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            try:
                await self.refresh()
            except Exception as exc:  # the store may be down: keep counting locally
                log.warning("reading the stored responses' sizes failed: %r", exc)

    # -- a call's response ------------------------------------------------------------------
    def admit(self, tenant_id: str, response: dict[str, Any], input_items: list[Any]) -> Pending:
        """Admit a ``store: true`` call whose response will be ``response`` (so far without
        output) and ``input_items``; ApiError 429 past the tenant's quota or the cap."""
        input_bytes = json_bytes(input_items)
        estimate = stored_bytes(
            response, input_bytes, str(response["id"]), tenant_id, "", str(response["model"])
        )
        hold = self.quota.reserve(tenant_id, estimate, datetime.now(UTC))
        return Pending(tenant_id, input_items, input_bytes, hold)

    def release(self, pending: Pending) -> None:
        """The call is over: its estimate stops counting (it does already once prepared)."""
        self.quota.release(pending.hold)

    def prepare(
        self, pending: Pending, *, session_key: str, response: dict[str, Any]
    ) -> ResponseRecord:
        """The record that keeps ``response`` (the gateway commits it with the call's own
        records; ``session_key`` is the proxy's session key, not the client's id); counted in
        the quota and remembered in memory at once, unless the id is another tenant's (which
        the store keeps too: proxy/store/batch.py)."""
        now = datetime.now(UTC)
        response_id, model = str(response["id"]), str(response["model"])
        record = ResponseRecord(
            response_id=response_id,
            tenant_id=pending.tenant_id,
            session_key=session_key,
            model=model,
            created_at=now,
            expires_at=now + self._ttl,
            response=response,
            input_items=pending.input_items,
            size_bytes=stored_bytes(
                response, pending.input_bytes, response_id, pending.tenant_id, session_key, model
            ),
        )
        self.quota.settle(pending.hold, response_id, record.size_bytes, record.expires_at)
        cached = self._cache.get(response_id)
        if cached is None or cached.tenant_id == pending.tenant_id:
            self._remember(record)
        return record

    # -- reads and deletes ------------------------------------------------------------------
    async def load(self, tenant_id: str, response_id: str) -> StoredResponseView | None:
        """The tenant's unexpired stored response ``response_id``, from memory or else the
        store (the writer flushed first); None if none."""
        now = datetime.now(UTC)
        record = self._cache.get(response_id)
        if record is not None:
            if record.tenant_id != tenant_id or record.expires_at <= now:
                return None
            return StoredResponseView(response_id, record.response, record.input_items)
        await self._writer.flush()
        return await self._store.get_response(tenant_id, response_id, now)

    async def delete(self, tenant_id: str, response_id: str) -> bool:
        """Delete the tenant's stored response and free its bytes; False if there was none."""
        if await self.load(tenant_id, response_id) is None:
            return False
        await self._writer.flush()
        freed = await self._store.delete_response(tenant_id, response_id)
        record = self._cache.pop(response_id, None)
        if record is not None:
            self._cache_bytes -= record.size_bytes
        if freed is None:
            return False
        self.quota.freed(tenant_id, response_id, freed)
        return True

    async def _purge_often(self) -> None:
        while True:
            await asyncio.sleep(PURGE_INTERVAL_S)
            try:
                await self.purge()
            except Exception as exc:  # the store may be down; try again next time
                log.warning("purging stored responses failed: %r", exc)

    async def purge(self) -> int:
        """Delete what expired (the store's rows; the cache drops expired entries as read,
        the quota at its next refresh)."""
        return await self._store.purge_responses(datetime.now(UTC))

    def _remember(self, record: ResponseRecord) -> None:
        """Keep ``record`` in memory, unless it alone is larger than ``cache_max_bytes``; the
        oldest go beyond ``cache_size`` entries or ``cache_max_bytes`` bytes."""
        replaced = self._cache.pop(record.response_id, None)
        if replaced is not None:
            self._cache_bytes -= replaced.size_bytes
        if record.size_bytes > self._cache_max_bytes:
            return
        self._cache[record.response_id] = record
        self._cache_bytes += record.size_bytes
        while len(self._cache) > self._cache_size or self._cache_bytes > self._cache_max_bytes:
            _, oldest = self._cache.popitem(last=False)
            self._cache_bytes -= oldest.size_bytes
