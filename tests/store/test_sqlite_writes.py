"""The SQLite writer thread: its commits never checkpoint the WAL (a checkpoint's fsync inside
a commit delayed every call waiting for that commit); the checkpointer does, beside it."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from talaria.proxy.contract.records import CallRecord, HintRecord, SessionRecord
from talaria.proxy.store.migrate import upgrade
from talaria.proxy.store.sqlite_writes import SqliteWrites

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def test_commits_leave_checkpoints_to_the_checkpointer(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    upgrade(f"sqlite+aiosqlite:///{path}")
    writes = SqliteWrites(path, None, checkpoint_interval_s=3600)  # only when called here
    try:

        async def write() -> None:
            await writes.write_batch([SessionRecord("s", "t", "m", T0, T0)])
            for _ in range(400):  # ~2 WAL pages each: past SQLite's 1,000-page autocheckpoint
                hints = [HintRecord("s", T0, float(j), "x" * 200) for j in range(20)]
                await writes.write_batch(hints)

        asyncio.run(write())
        frames, copied = writes.checkpoint()
        assert frames > 1000  # no commit checkpointed: the WAL kept every frame
        assert copied == frames  # the checkpointer copied them all
    finally:
        writes.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM hints").fetchone()[0] == 400 * 20


def test_the_writer_thread_writes_a_calls_slot_wait_and_engine_parts(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    upgrade(f"sqlite+aiosqlite:///{path}")
    writes = SqliteWrites(path, None, checkpoint_interval_s=3600)
    record = CallRecord(
        "r", "s", 0, "m", "n0", T0, T0, "ok", queue_s=2.0, slot_wait_s=1.5,
        engine_intake_s=0.25, engine_queue_s=0.125, engine_prefill_s=0.5, engine_decode_s=4.0,
    )  # fmt: skip
    try:
        asyncio.run(writes.write_batch([SessionRecord("s", "t", "m", T0, T0), record]))
    finally:
        writes.close()
    with sqlite3.connect(path) as db:
        row = db.execute(
            "SELECT queue_s, slot_wait_s, engine_intake_s, engine_queue_s, engine_prefill_s,"
            " engine_decode_s FROM calls WHERE request_id = 'r'"
        )
        assert row.fetchone() == (2.0, 1.5, 0.25, 0.125, 0.5, 4.0)
