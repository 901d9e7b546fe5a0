"""``SqliteWrites``: the writer's batches on SQLite, each one call into a thread of its own.

Through aiosqlite every statement is a round trip to aiosqlite's thread and back to the event
loop (cursor, execute, fetch, close: about 38 hops for a batch of 16 calls), each costing a
thread switch and a GIL hand-over. Here a batch is one job for one worker thread that holds a
plain ``sqlite3`` connection (SQLAlchemy's sync engine, the same pragmas as db.py): the event
loop hands the records over and awaits one future. SQLite releases the GIL while it works.

Reads (admin, stored responses, keys) keep using the async engine; in WAL mode the two
connections read and write the same file concurrently.

Checkpoints. By default SQLite copies the WAL back into the database (a checkpoint, with an
fsync) inside whichever commit crosses 1,000 WAL pages. With durable acknowledgement every call
waits for its commit, so every call in that batch waited for the checkpoint too: 1% of calls
took ~5 ms more (the p99 of docs/proxy-overhead.md). Here the writer's connection never
checkpoints (``wal_autocheckpoint=0``); a checkpointer thread runs a PASSIVE checkpoint, which
runs beside the writer and never blocks it, every :data:`CHECKPOINT_INTERVAL_S`.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event

from talaria.proxy.contract.records import Record
from talaria.proxy.store.batch import apply_batch
from talaria.proxy.store.db import sqlite_pragmas
from talaria.proxy.store.health import SqliteFileGuard, is_content_error

log = logging.getLogger(__name__)


CHECKPOINT_INTERVAL_S = 1.0
"""How often the checkpointer copies the WAL into the database file."""


def _no_autocheckpoint(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.execute("PRAGMA wal_autocheckpoint=0")


class SqliteWrites:
    """Writes batches to the SQLite file at ``path`` from one worker thread; checkpoints the
    WAL from another."""

    def __init__(
        self,
        path: Path,
        guard: SqliteFileGuard | None,
        checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
    ) -> None:
        self._engine = create_engine(f"sqlite:///{path}")
        event.listen(self._engine, "connect", sqlite_pragmas)
        event.listen(self._engine, "connect", _no_autocheckpoint)
        self._guard = guard
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="talaria-sqlite")
        self._interval_s = checkpoint_interval_s
        self._stop = threading.Event()
        self._checkpoints = sqlite3.connect(path, check_same_thread=False)
        self._checkpointer = threading.Thread(
            target=self._checkpoint_every, name="talaria-sqlite-checkpoint", daemon=True
        )
        self._checkpointer.start()

    def _checkpoint_every(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.checkpoint()
            except sqlite3.Error as exc:  # the file may be gone: the writer reports that
                log.warning("WAL checkpoint failed: %r", exc)

    def checkpoint(self) -> tuple[int, int]:
        """A PASSIVE checkpoint now: (frames in the WAL, frames copied to the database)."""
        _busy, frames, copied = self._checkpoints.execute(
            "PRAGMA wal_checkpoint(PASSIVE)"
        ).fetchone()
        return frames, copied

    async def write_batch(self, records: Sequence[Record]) -> None:
        """Apply ``records`` in one transaction, in the worker thread."""
        if not records:
            return
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._write, list(records))

    def _write(self, records: list[Record]) -> None:
        if self._guard is not None:
            self._guard.check()
        with self._engine.begin() as db:
            apply_batch(db, records)

    def is_content_error(self, exc: BaseException) -> bool:
        """Whether a write failed for the records' content (health.is_content_error)."""
        return is_content_error(exc)

    def close(self) -> None:
        """Stop the checkpointer, finish the write in progress and close the connections."""
        self._stop.set()
        self._checkpointer.join()
        self._thread.shutdown(wait=True)
        self._engine.dispose()
        self._checkpoints.close()
