"""``UsageTable``: the calls and tokens of each rate-limited API key per minute (``key_usage``),
shared by the replicas. Each replica adds the counts it gathered since its last sync in one
atomic upsert per sync (``INSERT … ON CONFLICT (key_id, window_start) DO UPDATE SET requests =
key_usage.requests + excluded.requests, tokens = …``, SQLite's and PostgreSQL's own), and reads
back the current minute's totals of every key in the same transaction; no replica ever
overwrites another's counts. proxy/callpath/limiter.py does the syncing and the limiting."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql, sqlite

from talaria.proxy.store.db import TableGroup
from talaria.proxy.store.models import KeyUsage

Counts = tuple[int, int]
"""(requests, tokens)."""
ROWS_PER_STATEMENT = 1000
"""Rows per upsert statement: 4,000 bound parameters, within SQLite's and asyncpg's limits."""


class UsageTable(TableGroup):
    """The per-minute usage of rate-limited keys: added to, read, and forgotten when old."""

    async def add_usage(
        self, added: Mapping[tuple[str, datetime], Counts], window: datetime
    ) -> dict[str, Counts]:
        """Add ``added`` ((key id, minute) → (requests, tokens), a count may be negative: a call
        given back) to the stored totals, atomically, and return the totals of minute
        ``window`` by key id (every key's, not only those added to), in one transaction."""
        async with self._sessionmaker() as db, db.begin():
            if added:
                rows = [
                    {"key_id": k, "window_start": w, "requests": r, "tokens": t}
                    for (k, w), (r, t) in sorted(added.items())  # one lock order for every writer
                ]
                dialect = (await db.connection()).dialect.name
                insert: Any = postgresql.insert if dialect == "postgresql" else sqlite.insert
                for start in range(0, len(rows), ROWS_PER_STATEMENT):
                    upsert = insert(KeyUsage).values(rows[start : start + ROWS_PER_STATEMENT])
                    await db.execute(
                        upsert.on_conflict_do_update(
                            index_elements=[KeyUsage.key_id, KeyUsage.window_start],
                            set_={
                                "requests": KeyUsage.requests + upsert.excluded.requests,
                                "tokens": KeyUsage.tokens + upsert.excluded.tokens,
                            },
                        )
                    )
            query = select(KeyUsage.key_id, KeyUsage.requests, KeyUsage.tokens).where(
                KeyUsage.window_start == window
            )
            totals = await db.execute(query)
            return {key_id: (requests, tokens) for key_id, requests, tokens in totals}

    async def forget_usage_before(self, cutoff: datetime) -> int:
        """Delete the rows of minutes that began before ``cutoff``; how many."""
        async with self._sessionmaker() as db, db.begin():
            result: Any = await db.execute(delete(KeyUsage).where(KeyUsage.window_start < cutoff))
            return int(result.rowcount or 0)
