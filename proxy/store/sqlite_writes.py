"""``SqliteWrites``: the writer's batches on SQLite, each one call into a thread of its own.

Through aiosqlite every statement is a round trip to aiosqlite's thread and back to the event
loop (cursor, execute, fetch, close: about 38 hops for a batch of 16 calls), each costing a
thread switch and a GIL hand-over. Here a batch is one job for one worker thread that holds a
plain ``sqlite3`` connection (SQLAlchemy's sync engine, the same pragmas as db.py): the event
loop hands the records over and awaits one future. SQLite releases the GIL while it works.

Reads (admin, stored responses, keys) keep using the async engine; in WAL mode the two
connections read and write the same file concurrently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.orm import Session

from talaria.proxy.records import Record
from talaria.proxy.store.batch import apply_batch
from talaria.proxy.store.db import sqlite_pragmas
from talaria.proxy.store.health import SqliteFileGuard, is_content_error


class SqliteWrites:
    """Writes batches to the SQLite file at ``path`` from one worker thread."""

    def __init__(self, path: Path, guard: SqliteFileGuard | None) -> None:
        self._engine = create_engine(f"sqlite:///{path}")
        event.listen(self._engine, "connect", sqlite_pragmas)
        self._guard = guard
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="talaria-sqlite")

    async def write_batch(self, records: Sequence[Record]) -> None:
        """Apply ``records`` in one transaction, in the worker thread."""
        if not records:
            return
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._write, list(records))

    def _write(self, records: list[Record]) -> None:
        if self._guard is not None:
            self._guard.check()
        with Session(self._engine) as db, db.begin():
            apply_batch(db, records)

    def is_content_error(self, exc: BaseException) -> bool:
        return is_content_error(exc)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self._engine.dispose()
