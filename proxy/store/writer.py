"""``BatchWriter``: the request path hands records over without waiting for the database.

``submit`` appends to an in-memory queue (O(1), never blocks, never drops). A background task
writes the queue in batches, in order: ``flush_interval_s`` after the first waiting record, or
at once when ``max_batch`` records wait or someone calls :meth:`BatchWriter.flush`. A failed
batch stays at the head of the queue and is retried after a capped exponential backoff, so
records are written in submission order, each batch as a whole (the store's ``write_batch`` is
idempotent, so a retry after an ambiguous failure does not duplicate anything).

Call ``submit`` from the event loop's thread (it is not thread-safe).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence
from itertools import islice
from typing import Protocol

from talaria.proxy.records import Record

log = logging.getLogger(__name__)


class RecordStore(Protocol):
    """What the writer writes to (``SqlStore``, or a fake in tests)."""

    async def write_batch(self, records: Sequence[Record]) -> None: ...


class BatchWriter:
    """Buffers records and writes them to ``store`` in ordered batches from a background task."""

    def __init__(
        self,
        store: RecordStore,
        flush_interval_s: float = 0.05,
        max_batch: int = 1000,
        *,
        initial_backoff_s: float = 0.05,
        max_backoff_s: float = 5.0,
    ) -> None:
        if flush_interval_s < 0 or max_batch < 1 or initial_backoff_s <= 0:
            raise ValueError("need flush_interval_s >= 0, max_batch >= 1, initial_backoff_s > 0")
        self._store = store
        self._flush_interval_s = flush_interval_s
        self._max_batch = max_batch
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max(max_backoff_s, initial_backoff_s)
        self._queue: deque[Record] = deque()
        self._submitted = 0
        self._written = 0
        self._failures = 0
        self._closed = False
        self._flush_waiters = 0
        self._has_data = asyncio.Event()
        self._urgent = asyncio.Event()
        self._progress = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- counters ---------------------------------------------------------------------------

    @property
    def written(self) -> int:
        """Records written so far."""
        return self._written

    @property
    def pending(self) -> int:
        """Records submitted and not yet written (including a batch being written)."""
        return len(self._queue)

    @property
    def failures(self) -> int:
        """Failed ``write_batch`` calls so far (each was, or will be, retried)."""
        return self._failures

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (``submit`` then raises)."""
        return self._closed

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the background task (idempotent)."""
        if self._closed:
            raise RuntimeError("BatchWriter is closed")
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="talaria-batch-writer")

    def submit(self, record: Record) -> None:
        """Queue ``record`` for writing; O(1), never blocks. ``RuntimeError`` after close."""
        if self._closed:
            raise RuntimeError("BatchWriter is closed: no more records can be submitted")
        self._queue.append(record)
        self._submitted += 1
        self._has_data.set()
        if len(self._queue) >= self._max_batch:
            self._urgent.set()

    async def flush(self) -> None:
        """Return once every record submitted before this call is written. Waits through
        retries; raises ``RuntimeError`` if the writer is not running."""
        target = self._submitted
        self._flush_waiters += 1
        try:
            while self._written < target:
                task = self._task
                if task is None or task.done():
                    raise RuntimeError("BatchWriter is not running: call start() first")
                self._urgent.set()
                self._progress.clear()
                progressed = asyncio.ensure_future(self._progress.wait())
                try:
                    await asyncio.wait({progressed, task}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    progressed.cancel()
        finally:
            self._flush_waiters -= 1

    async def close(self) -> None:
        """Stop taking records, write everything queued, and stop the background task.

        Waits through retries for as long as the store keeps failing: bound it with
        ``asyncio.wait_for`` if needed (the task keeps going; the records stay queued)."""
        self._closed = True
        self._urgent.set()
        self._has_data.set()
        if self._task is not None:
            await asyncio.shield(self._task)
        elif self._queue:
            raise RuntimeError(f"BatchWriter closed before start with {len(self._queue)} queued")

    # -- background task --------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = self._initial_backoff_s
        while True:
            if not self._queue:
                if self._closed:
                    return
                self._has_data.clear()
                self._urgent.clear()
                await self._has_data.wait()
                continue
            if not (self._urgent.is_set() or self._closed):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._urgent.wait(), self._flush_interval_s)
            batch = list(islice(self._queue, self._max_batch))
            try:
                await self._store.write_batch(batch)
            except Exception:
                self._failures += 1
                log.warning(
                    "writing %d records failed (failure %d); retrying in %.2f s",
                    len(batch),
                    self._failures,
                    backoff,
                    exc_info=True,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
                continue
            backoff = self._initial_backoff_s
            for _ in batch:
                self._queue.popleft()
            self._written += len(batch)
            if len(self._queue) < self._max_batch and not self._flush_waiters:
                self._urgent.clear()
            self._progress.set()
