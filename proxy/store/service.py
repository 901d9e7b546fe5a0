"""The session store as the proxy runs it: migrated, guarded, written through the batched
writer, with its dead letters; opened by the app's lifespan and checked by ``/readyz``."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.store.db import (
    data_dir,
    default_url,
    make_engine,
    make_sessionmaker,
    sqlite_path,
)
from talaria.proxy.store.deadletters import DEAD_LETTER_FILE, DeadLetters
from talaria.proxy.store.health import SqliteFileGuard
from talaria.proxy.store.kept_writes import KeptConnectionWrites
from talaria.proxy.store.migrate import upgrade_async
from talaria.proxy.store.repository import SqlStore
from talaria.proxy.store.sqlite_writes import SqliteWrites
from talaria.proxy.store.writer import BatchWriter, RecordStore

log = logging.getLogger("talaria.proxy")

PING_TIMEOUT_S = 1.0
"""``/readyz`` gives the database this long to answer ``SELECT 1``."""


def location(url: str) -> str:
    """Where the store is, for people: the SQLite file, or the URL without its password."""
    path = sqlite_path(url)
    if path is not None:
        return str(path.resolve())
    return make_url(url).render_as_string(hide_password=True)


def dead_letter_path(settings: ProxySettings, url: str) -> Path:
    """``settings.dead_letter_path``, else next to the SQLite file, else in the data dir."""
    if settings.dead_letter_path:
        return Path(settings.dead_letter_path)
    path = sqlite_path(url)
    return (path.parent if path is not None else data_dir()) / DEAD_LETTER_FILE


@dataclass
class StoreService:
    """The open store: its URL, engine, ``SqlStore``, writer and dead letters."""

    url: str
    engine: AsyncEngine
    store: SqlStore
    writer: BatchWriter
    dead_letters: DeadLetters
    writes: RecordStore
    """What the writer writes to: on PostgreSQL a connection kept between batches
    (kept_writes.py), on SQLite a worker thread's connection (sqlite_writes.py)."""

    @classmethod
    async def open(cls, settings: ProxySettings) -> StoreService:
        """Migrate (unless off), open, end the sessions a previous process left open, and
        start the writer."""
        url = settings.database_url or default_url()
        log.info("session store: %s", location(url))
        if settings.auto_migrate:
            await upgrade_async(url)
        engine = make_engine(url)
        guard = SqliteFileGuard.of(url)
        store = SqlStore(make_sessionmaker(engine), guard)
        path = sqlite_path(url)
        writes: RecordStore = (
            KeptConnectionWrites(engine) if path is None else SqliteWrites(path, guard)
        )
        dead_letters = DeadLetters(store.dead_letters, dead_letter_path(settings, url))
        writer = BatchWriter(
            writes,
            flush_interval_s=settings.writer_flush_interval_s,
            max_pending=settings.writer_max_pending,
            quarantine=dead_letters,
        )
        if settings.replica_url is None:  # replicas share the store: they end only stale ones
            ended = await store.sessions.end_open_sessions("restart", datetime.now(UTC))
            if ended:
                log.warning(
                    "ended %d sessions left open by a previous run (reason 'restart')", ended
                )
        await writer.start()
        return cls(url, engine, store, writer, dead_letters, writes)

    async def readiness(self) -> dict[str, Any]:
        """Whether the store can take writes now: ``{"ok": bool, ...}`` with the reason."""
        writer = self.writer
        if writer.failing_since is not None:
            failing_s = time.monotonic() - writer.failing_since
            return {
                "ok": False,
                "error": f"writes failing for {failing_s:.1f} s: {writer.last_error!r}",
                "pending": writer.pending,
            }
        if writer.full:
            return {"ok": False, "error": "the write queue is full", "pending": writer.pending}
        try:
            await asyncio.wait_for(self.store.ping(), PING_TIMEOUT_S)
        except Exception as exc:
            return {"ok": False, "error": repr(exc), "pending": writer.pending}
        return {"ok": True, "pending": writer.pending, "quarantined": writer.quarantined}

    async def close(self) -> None:
        """Stop the SQLite write thread, or return the writes' connection, then close the
        engine's connections."""
        if isinstance(self.writes, SqliteWrites):
            await asyncio.to_thread(self.writes.close)
        elif isinstance(self.writes, KeptConnectionWrites):
            await self.writes.close()
        await self.engine.dispose()
