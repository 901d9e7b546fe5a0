"""What one batch of the proxy's records costs to write to SQLite, by batch size and path.

    .venv/bin/python bench/store_writes.py [--batches 300] [--sizes 1,4,16,64] [--json PATH]

A batch holds, per call, what the gateway writes for a continuation: its routing decision, the
call, and the session's update (the sessions exist already). Two paths, each on a fresh file:

- ``thread``: what the proxy runs on SQLite, ``SqliteWrites.write_batch`` (one job for a worker
  thread with its own connection, proxy/store/sqlite_writes.py);
- ``aiosqlite``: ``SqlStore.write_batch`` on the async engine (what PostgreSQL's asyncpg path
  looks like; on SQLite every statement is a round trip to aiosqlite's thread).

Per batch: wall time, and this process's CPU time (all threads). Results: docs/proxy-overhead.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from talaria.proxy.contract.records import CallRecord, DecisionRecord, Record, SessionRecord
from talaria.proxy.store.db import make_engine, make_sessionmaker
from talaria.proxy.store.migrate import upgrade
from talaria.proxy.store.repository import SqlStore
from talaria.proxy.store.sqlite_writes import SqliteWrites

NOW = datetime.now(UTC)


def _batch(sessions: Sequence[str], index: int) -> list[Record]:
    records: list[Record] = []
    for sid in sessions:
        rid = uuid.uuid4().hex
        records.append(DecisionRecord(rid, sid, "talaria", "node0", "kv_locality", {}, NOW))
        call = CallRecord(rid, sid, index, "m", "node0", NOW, NOW, "ok", output_tokens=12)
        records.append(call)
        records.append(SessionRecord(sid, "t", "m", NOW, NOW))
    return records


async def _measure(
    write: Callable[[Sequence[Record]], Awaitable[None]], size: int, batches: int
) -> dict[str, float]:
    sessions = [f"s{i}" for i in range(size)]
    await write([SessionRecord(s, "t", "m", NOW, NOW) for s in sessions])
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for index in range(batches):
        await write(_batch(sessions, index))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {"wall_ms_per_batch": wall / batches * 1e3, "cpu_ms_per_batch": cpu / batches * 1e3}


async def _run_path(path_name: str, size: int, batches: int) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix="talaria-store-writes-"))
    url = f"sqlite+aiosqlite:///{folder / 'w.db'}"
    await asyncio.to_thread(upgrade, url)
    if path_name == "thread":
        writes = SqliteWrites(folder / "w.db", None)
        try:
            return await _measure(writes.write_batch, size, batches)
        finally:
            writes.close()
    engine = make_engine(url)
    try:
        return await _measure(SqlStore(make_sessionmaker(engine)).write_batch, size, batches)
    finally:
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=300, help="batches per size and path")
    parser.add_argument("--sizes", default="1,4,16,64", help="calls per batch, comma-separated")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = []
    print("| path | calls per batch | wall ms per batch | CPU ms per batch | CPU ms per call |")
    print("|---|---|---|---|---|")
    for path_name in ("thread", "aiosqlite"):
        for size in sizes:
            figures = asyncio.run(_run_path(path_name, size, args.batches))
            rows.append({"path": path_name, "calls_per_batch": size, **figures})
            print(
                f"| {path_name} | {size} | {figures['wall_ms_per_batch']:.2f} "
                f"| {figures['cpu_ms_per_batch']:.2f} "
                f"| {figures['cpu_ms_per_batch'] / size:.3f} |",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps({"batches": args.batches, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
