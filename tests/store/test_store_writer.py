"""``BatchWriter``: ordered batches, flush, retries with backoff, close."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import pytest

from talaria.proxy.records import CallRecord, HintRecord, Record, SessionRecord
from talaria.proxy.store.repository import SqlStore
from talaria.proxy.store.writer import BatchWriter

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def hint(i: int) -> HintRecord:
    return HintRecord(session_id="s1", at=T0 + timedelta(microseconds=i), expected_s=float(i))


class FakeStore:
    """Records every batch it accepts; fails the first ``fail_first`` calls."""

    def __init__(self, fail_first: int = 0) -> None:
        self.fail_first = fail_first
        self.calls = 0
        self.batches: list[list[Record]] = []

    async def write_batch(self, records: Sequence[Record]) -> None:
        self.calls += 1
        await asyncio.sleep(0)
        if self.calls <= self.fail_first:
            raise ConnectionError(f"database down (call {self.calls})")
        self.batches.append(list(records))

    @property
    def records(self) -> list[Record]:
        return [r for batch in self.batches for r in batch]


@pytest.mark.asyncio
async def test_many_submits_then_flush_write_everything_in_order(store: SqlStore) -> None:
    writer = BatchWriter(store, flush_interval_s=0.01, max_batch=64)
    await writer.start()
    records: list[Record] = [SessionRecord("s1", "acme", "glm", T0, T0)]
    for i in range(500):
        records.append(
            CallRecord(f"r{i:04d}", "s1", i, "glm", "node-0", T0, None, "ok", output_tokens=1)
        )
        records.append(hint(i))
    for record in records:
        writer.submit(record)
    assert writer.pending > 0
    await writer.flush()
    assert (writer.written, writer.pending, writer.failures) == (len(records), 0, 0)
    detail = await store.get_session("s1")
    assert detail is not None
    assert [c.call_index for c in detail.calls] == list(range(500))
    assert detail.session.calls == 500 and detail.session.output_tokens == 500
    assert [h.expected_s for h in detail.hints] == [float(i) for i in range(500)]
    await writer.close()


@pytest.mark.asyncio
async def test_batches_are_ordered_and_bounded() -> None:
    fake = FakeStore()
    writer = BatchWriter(fake, flush_interval_s=0.001, max_batch=7)
    await writer.start()
    for i in range(100):
        writer.submit(hint(i))
        if i % 13 == 0:
            await asyncio.sleep(0.002)
    await writer.flush()
    assert fake.records == [hint(i) for i in range(100)]
    assert all(1 <= len(b) <= 7 for b in fake.batches)
    await writer.close()


@pytest.mark.asyncio
async def test_full_batch_is_written_without_waiting_for_the_interval() -> None:
    fake = FakeStore()
    writer = BatchWriter(fake, flush_interval_s=60, max_batch=10)
    await writer.start()
    for i in range(10):
        writer.submit(hint(i))
    await asyncio.wait_for(_until(lambda: writer.written == 10), timeout=2)
    writer.submit(hint(10))  # a lone record waits for the interval...
    await asyncio.sleep(0.05)
    assert writer.pending == 1
    await asyncio.wait_for(writer.flush(), timeout=2)  # ...unless flushed
    assert writer.written == 11
    await writer.close()


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.001)


@pytest.mark.asyncio
async def test_failed_writes_are_retried_in_order_without_duplicates(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeStore(fail_first=4)
    writer = BatchWriter(
        fake, flush_interval_s=0.001, max_batch=5, initial_backoff_s=0.001, max_backoff_s=0.004
    )
    await writer.start()
    with caplog.at_level(logging.WARNING, logger="talaria.proxy.store.writer"):
        for i in range(23):
            writer.submit(hint(i))
        flushing = asyncio.create_task(writer.flush())
        await asyncio.sleep(0.001)
        for i in range(23, 40):  # submitted while earlier batches are being retried
            writer.submit(hint(i))
        await asyncio.wait_for(flushing, timeout=5)
        assert writer.written >= 23
        await asyncio.wait_for(writer.flush(), timeout=5)
    assert fake.records == [hint(i) for i in range(40)]
    assert writer.failures == 4 and writer.written == 40 and writer.pending == 0
    assert sum("failed" in r.getMessage() for r in caplog.records) == 4
    await writer.close()


@pytest.mark.asyncio
async def test_close_flushes_then_submit_raises() -> None:
    fake = FakeStore(fail_first=1)
    writer = BatchWriter(fake, flush_interval_s=60, initial_backoff_s=0.001)
    await writer.start()
    for i in range(3):
        writer.submit(hint(i))
    await asyncio.wait_for(writer.close(), timeout=2)
    assert fake.records == [hint(0), hint(1), hint(2)] and writer.closed
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit(hint(3))
    await writer.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        await writer.start()


@pytest.mark.asyncio
async def test_flush_needs_a_running_writer() -> None:
    writer = BatchWriter(FakeStore())
    await writer.flush()  # nothing submitted: nothing to wait for
    writer.submit(hint(0))
    with pytest.raises(RuntimeError, match="not running"):
        await writer.flush()
    with pytest.raises(ValueError):
        BatchWriter(FakeStore(), max_batch=0)
