"""``BatchWriter``: ordered batches, flush, retries with backoff, close; group commit,
quarantine of refused records, the bound, and no record lost whatever fails."""

from __future__ import annotations

import asyncio
import json
import logging
import stat
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talaria.proxy.contract.records import CallRecord, HintRecord, Record, SessionRecord
from talaria.proxy.store.deadletters import DeadLetters
from talaria.proxy.store.repository import SqlStore
from talaria.proxy.store.writer import BatchWriter

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def hint(i: int) -> HintRecord:
    return HintRecord(session_key="s1", at=T0 + timedelta(microseconds=i), expected_s=float(i))


class Refused(ValueError):
    """What FakeStore raises for a record it will never take (a content error)."""


class FakeStore:
    """Records every batch it accepts; fails the first ``fail_first`` calls (transient), and
    every batch holding a record ``refuse`` says no to (content)."""

    def __init__(
        self, fail_first: int = 0, refuse: Callable[[Record], bool] = lambda _: False
    ) -> None:
        self.fail_first = fail_first
        self.refuse = refuse
        self.calls = 0
        self.batches: list[list[Record]] = []

    async def write_batch(self, records: Sequence[Record]) -> None:
        self.calls += 1
        await asyncio.sleep(0)
        if self.calls <= self.fail_first:
            raise ConnectionError(f"database down (call {self.calls})")
        if any(self.refuse(r) for r in records):
            raise Refused("a record has a NUL")
        self.batches.append(list(records))

    def is_content_error(self, exc: BaseException) -> bool:
        return isinstance(exc, Refused)

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
    detail = await store.sessions.get_session("s1")
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


class KeptInQuarantine:
    def __init__(self) -> None:
        self.records: list[Record] = []

    async def keep(self, record: Record, error: BaseException) -> None:
        self.records.append(record)


@pytest.mark.asyncio
async def test_refused_records_are_quarantined_and_never_block_the_rest() -> None:
    poison = {3, 17, 18, 40}
    fake = FakeStore(refuse=lambda r: isinstance(r, HintRecord) and r.expected_s in poison)
    quarantine = KeptInQuarantine()
    writer = BatchWriter(fake, flush_interval_s=0.001, max_batch=16, quarantine=quarantine)
    await writer.start()
    for i in range(50):
        writer.submit(hint(i))
    await asyncio.wait_for(writer.flush(), timeout=5)
    assert fake.records == [hint(i) for i in range(50) if i not in poison]  # in order
    assert quarantine.records == [hint(i) for i in sorted(poison)]
    assert (writer.quarantined, writer.pending, writer.failing_since) == (4, 0, None)
    await writer.close()


@pytest.mark.asyncio
async def test_commit_waiters_are_served_by_group_commit() -> None:
    """200 calls each wait for their own record's commit: a slow store (5 ms a transaction)
    takes them in a few batches, and each waiter returns only once its record is written."""

    class SlowStore(FakeStore):
        async def write_batch(self, records: Sequence[Record]) -> None:
            await asyncio.sleep(0.005)
            await super().write_batch(records)

    slow = SlowStore()
    writer = BatchWriter(slow, flush_interval_s=60)  # nobody would wait for the interval

    async def call(i: int) -> None:
        seq = writer.submit(hint(i))
        await writer.committed(seq)
        assert hint(i) in slow.records

    await writer.start()
    await asyncio.wait_for(asyncio.gather(*(call(i) for i in range(200))), timeout=10)
    assert slow.records == [hint(i) for i in range(200)]
    assert len(slow.batches) <= 10
    await writer.close()


@pytest.mark.asyncio
async def test_a_full_queue_says_so_and_close_returns_what_it_could_not_write() -> None:
    down = FakeStore(fail_first=10**9)
    writer = BatchWriter(down, flush_interval_s=0.001, max_pending=5, initial_backoff_s=0.001)
    await writer.start()
    for i in range(4):
        writer.submit(hint(i))
    assert not writer.full
    writer.submit(hint(4))
    assert writer.full
    await asyncio.wait_for(_until(lambda: writer.failing_since is not None), timeout=2)
    left = await asyncio.wait_for(writer.close(timeout_s=0.05), timeout=2)
    assert left == [hint(i) for i in range(5)] and writer.pending == 0
    assert isinstance(writer.last_error, ConnectionError)


@pytest.mark.asyncio
async def test_nul_in_a_record_is_quarantined_on_postgresql_and_kept_on_sqlite(
    store: SqlStore, db_url: str
) -> None:
    """PostgreSQL refuses a NUL in text (SQLSTATE 22021); the record goes to the dead letters
    and the records behind it are written. SQLite stores it as is."""
    dead = DeadLetters(store.dead_letters, Path("/nonexistent/dead-letters.jsonl"))
    writer = BatchWriter(store, flush_interval_s=0.001, quarantine=dead)
    await writer.start()
    writer.submit(SessionRecord("s1", "acme", "glm", T0, T0))
    writer.submit(HintRecord("s1", T0, 1.0, "bash\x00"))
    for i in range(1, 4):
        writer.submit(hint(i))
    await asyncio.wait_for(writer.flush(), timeout=10)
    await writer.close()
    detail = await store.sessions.get_session("s1")
    assert detail is not None
    letters = await store.dead_letters.list_dead_letters()
    if db_url.startswith("postgresql"):
        assert [h.expected_s for h in detail.hints] == [1.0, 2.0, 3.0]
        assert [(d.kind, json.loads(d.payload)["tool"]) for d in letters] == [
            ("HintRecord", "bash\x00")
        ]
        assert "22021" in letters[0].error or "0x00" in letters[0].error
    else:
        assert [h.tool for h in detail.hints] == ["bash\x00", None, None, None]
        assert letters == []


@pytest.mark.asyncio
async def test_dead_letters_fall_back_to_a_private_file(tmp_path: Path) -> None:
    class NoTable:
        async def write_dead_letter(self, *args: object) -> None:
            raise ConnectionError("database down")

    path = tmp_path / "dl" / "dead-letters.jsonl"
    dead = DeadLetters(NoTable(), path)
    await dead.keep(HintRecord("s1", T0, 1.0, "a\x00b"), Refused("NUL"))
    assert dead.spill([hint(7)], "unwritten at shutdown", "timeout") == path
    lines = [json.loads(line) for line in path.read_text(encoding="ascii").splitlines()]
    assert [(x["reason"], x["kind"], x["record"]["expected_s"]) for x in lines] == [
        ("refused", "HintRecord", 1.0),
        ("unwritten at shutdown", "HintRecord", 7.0),
    ]
    assert lines[0]["record"]["tool"] == "a\x00b"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


class ScriptedStore(FakeStore):
    """Each write_batch call takes the next outcome of a script: "ok", "down" (transient)."""

    def __init__(self, script: list[str], refuse: Callable[[Record], bool]) -> None:
        super().__init__(refuse=refuse)
        self.script = script

    async def write_batch(self, records: Sequence[Record]) -> None:
        outcome = self.script[self.calls] if self.calls < len(self.script) else "ok"
        if outcome == "down":
            self.calls += 1
            raise ConnectionError("down")
        self.calls += 1
        await asyncio.sleep(0)
        if any(self.refuse(r) for r in records):
            raise Refused("refused")
        self.batches.append(list(records))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=6),
    poison=st.sets(st.integers(0, 119), max_size=10),
    script=st.lists(st.sampled_from(["ok", "down"]), max_size=12),
    max_batch=st.integers(1, 40),
)
def test_no_record_is_lost_or_duplicated(
    sizes: list[int], poison: set[int], script: list[str], max_batch: int
) -> None:
    """Whatever the failures (transient ones retried, refused records quarantined) and however
    records arrive, every record ends up exactly once: written (in submission order) or
    quarantined."""

    async def main() -> tuple[ScriptedStore, KeptInQuarantine, int]:
        fake = ScriptedStore(script, lambda r: isinstance(r, HintRecord) and r.expected_s in poison)
        quarantine = KeptInQuarantine()
        writer = BatchWriter(
            fake,
            flush_interval_s=0.0005,
            max_batch=max_batch,
            quarantine=quarantine,
            initial_backoff_s=0.0001,
            max_backoff_s=0.0005,
        )
        await writer.start()
        n = 0
        for size in sizes:
            for _ in range(size):
                writer.submit(hint(n))
                n += 1
            await asyncio.sleep(0)
        await asyncio.wait_for(writer.flush(), timeout=10)
        await writer.close()
        return fake, quarantine, n

    fake, quarantine, n = asyncio.run(main())
    written = fake.records
    assert written == [hint(i) for i in range(n) if i not in poison]
    assert quarantine.records == [hint(i) for i in range(n) if i in poison]
