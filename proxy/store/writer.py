"""``BatchWriter``: records leave the request path in ordered batches, with group commit.

``submit`` appends to an in-memory queue (O(1), never blocks, never drops) and returns the
record's sequence number. A background task writes the queue in batches, in order, each batch
one transaction:

- when someone waits for a commit (:meth:`committed`, :meth:`flush`), at once: *group commit*.
  The records that arrive while a batch is being written form the next batch, so under load
  one transaction carries many calls and a waiting call is delayed by at most about two
  transactions;
- when ``max_batch`` records wait, at once;
- otherwise ``flush_interval_s`` after the first waiting record.

Faults:

- A batch that fails for a *transient* reason (the database is down, the disk is full, the
  SQLite file is gone) stays at the head of the queue and is retried after a capped exponential
  backoff. The store's ``write_batch`` is idempotent, so a retry after an ambiguous failure
  duplicates nothing. :attr:`failing_since` says since when the head has not been written.
- A batch the database refuses for its *content* (``store.is_content_error``: a NUL byte
  PostgreSQL will not store, a constraint) is split in halves until the records at fault are
  alone; each of those goes to ``quarantine`` (the dead letters) and never blocks the records
  behind it.

Bounds: :attr:`full` says the queue holds ``max_pending`` records or more; the gateway then
refuses new calls (503) instead of growing the queue, while the calls already running still
submit theirs (so no acknowledged record is ever dropped; the queue exceeds ``max_pending`` by
at most the records of the calls in flight).

Call ``submit`` from the event loop's thread (it is not thread-safe).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Sequence
from itertools import islice
from typing import Protocol

from talaria.proxy.contract.records import Record

log = logging.getLogger(__name__)


class RecordStore(Protocol):
    """What the writer writes to (``SqlStore``, or a fake in tests)."""

    async def write_batch(self, records: Sequence[Record]) -> None:
        """Apply ``records`` in order in one transaction; applying them twice changes nothing."""
        ...

    def is_content_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the records themselves are refused (retrying cannot help)."""
        ...


class Quarantine(Protocol):
    """Where refused records go (``DeadLetters``)."""

    async def keep(self, record: Record, error: BaseException) -> None:
        """Keep ``record``, which the database refused with ``error``."""
        ...


class _LogOnly:
    async def keep(self, record: Record, error: BaseException) -> None:
        log.error("dropping a record the database refuses: %r (%r)", record, error)


class BatchWriter:
    """Buffers records and writes them to ``store`` in ordered batches from a background task."""

    def __init__(
        self,
        store: RecordStore,
        flush_interval_s: float = 0.05,
        max_batch: int = 1000,
        *,
        max_pending: int = 50_000,
        quarantine: Quarantine | None = None,
        initial_backoff_s: float = 0.05,
        max_backoff_s: float = 1.0,
    ) -> None:
        if flush_interval_s < 0 or max_batch < 1 or max_pending < 1 or initial_backoff_s <= 0:
            raise ValueError(
                "need flush_interval_s >= 0, max_batch >= 1, max_pending >= 1, "
                "initial_backoff_s > 0"
            )
        self._store = store
        self._quarantine: Quarantine = quarantine or _LogOnly()
        self._flush_interval_s = flush_interval_s
        self._max_batch = max_batch
        self._max_pending = max_pending
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max(max_backoff_s, initial_backoff_s)
        self._queue: deque[Record] = deque()
        self._submitted = 0
        self._written = 0
        self._failures = 0
        self._quarantined = 0
        self._failing_since: float | None = None
        self._last_error: BaseException | None = None
        self._closed = False
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # a heap by seq
        self._tiebreak = itertools.count()
        self._has_data = asyncio.Event()
        self._urgent = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- counters ---------------------------------------------------------------------------

    @property
    def written(self) -> int:
        """Records written (or quarantined) so far."""
        return self._written

    @property
    def pending(self) -> int:
        """Records submitted and not yet written (including a batch being written)."""
        return len(self._queue)

    @property
    def full(self) -> bool:
        """Whether ``max_pending`` or more records wait (new calls should be refused)."""
        return len(self._queue) >= self._max_pending

    @property
    def failures(self) -> int:
        """Failed ``write_batch`` calls so far (each was, or will be, retried or split)."""
        return self._failures

    @property
    def quarantined(self) -> int:
        """Records the database refused and that went to the quarantine."""
        return self._quarantined

    @property
    def failing_since(self) -> float | None:
        """``time.monotonic()`` of the first failure of the batch now at the head of the
        queue; None while writes succeed."""
        return self._failing_since

    @property
    def last_error(self) -> BaseException | None:
        """The error of the last failed write (kept after recovery, for diagnostics)."""
        return self._last_error

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
            self._task.add_done_callback(self._stopped)

    def submit(self, record: Record) -> int:
        """Queue ``record`` for writing; O(1), never blocks. Returns its sequence number (for
        :meth:`committed`). ``RuntimeError`` after close."""
        if self._closed:
            raise RuntimeError("BatchWriter is closed: no more records can be submitted")
        self._queue.append(record)
        self._submitted += 1
        self._has_data.set()
        if len(self._queue) >= self._max_batch:
            self._urgent.set()
        return self._submitted

    async def committed(self, seq: int) -> None:
        """Return once record ``seq`` and every record before it is written (group commit:
        the writer stops waiting for more records). Waits through retries; raises
        ``RuntimeError`` if the writer is not running."""
        if self._written >= seq:
            return
        task = self._task
        if task is None or task.done():
            raise RuntimeError("BatchWriter is not running: call start() first")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (seq, next(self._tiebreak), waiter))
        self._urgent.set()
        await waiter  # resolved by _wake_waiters, or failed by _stopped

    async def flush(self) -> None:
        """Return once every record submitted before this call is written."""
        await self.committed(self._submitted)

    async def close(self, timeout_s: float | None = None) -> list[Record]:
        """Stop taking records and write everything queued, for at most ``timeout_s``
        (None: for as long as it takes). Returns the records that could not be written in
        that time (the caller keeps them elsewhere); the writer is stopped either way."""
        self._closed = True
        self._urgent.set()
        self._has_data.set()
        if self._task is None:
            return list(self._queue)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)
        if not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        left = list(self._queue)
        self._queue.clear()
        return left

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
                await self._write(batch)
            except Exception as exc:
                self._failed(exc)
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                log.warning(
                    "writing %d records failed (failure %d); retrying in %.2f s: %r",
                    len(batch),
                    self._failures,
                    backoff,
                    exc,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
                continue
            backoff = self._initial_backoff_s
            self._failing_since = None
            if len(self._queue) < self._max_batch and not self._waiters:
                self._urgent.clear()

    async def _write(self, batch: Sequence[Record]) -> None:
        """Write ``batch`` (the head of the queue) and take it off the queue. When the database
        refuses its content, split it until the refused records are alone and quarantine
        those; each part leaves the queue as soon as it is written or quarantined, so a
        transient error on a later part propagates (to be retried) without the earlier parts
        being written twice."""
        try:
            await self._store.write_batch(batch)
        except Exception as exc:
            if not self._store.is_content_error(exc):
                raise
            self._failed(exc)
            if len(batch) > 1:
                middle = len(batch) // 2
                await self._write(batch[:middle])
                await self._write(batch[middle:])
                return
            self._quarantined += 1
            log.error("quarantining a record the database refuses: %r", exc)
            try:
                await self._quarantine.keep(batch[0], exc)
            except Exception:  # the quarantine logs what it could not keep
                log.exception("the quarantine failed to keep %r", batch[0])
        self._done(len(batch))

    def _done(self, count: int) -> None:
        """The ``count`` records at the head of the queue are written (or quarantined)."""
        for _ in range(count):
            self._queue.popleft()
        self._written += count
        self._wake_waiters()

    def _failed(self, exc: BaseException) -> None:
        self._failures += 1
        self._last_error = exc

    def _stopped(self, task: asyncio.Task[None]) -> None:
        """The background task ended: whoever still waits for a commit never gets one."""
        for _seq, _order, waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(
                    RuntimeError("BatchWriter stopped before the records were written")
                )
        self._waiters.clear()

    def _wake_waiters(self) -> None:
        while self._waiters and self._waiters[0][0] <= self._written:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.done():
                waiter.set_result(None)
