"""Does the proxy's batched writer keep up under sustained load?

    .venv/bin/python bench/overhead/writer_lag.py [--seconds 8] [--concurrency 1] \\
        [--stream] [--switch-interval S]

Starts the talaria bench server (servers.py: InstantRuntime, SQLite persistence), sends
non-streaming (or streaming) chat calls for ``--seconds`` at ``--concurrency``, and reads the
writer's backlog (``talaria_store_pending_records`` on /metrics) every 0.5 s, then how long the
backlog takes to drain once the load stops. Prints one line per sample and a summary; each call
submits 3 records (routing decision, call, session).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from overhead.apis import APIS
from overhead.client import run_batch
from overhead.measure import Workload, writer_backlog
from overhead.procs import HOST, SERVERS, free_port, start_server, stop_server, wait_ready


async def probe(port: int, seconds: float, concurrency: int, stream: bool) -> dict[str, float]:
    workload = Workload(800, 4, APIS["chat"])
    judge = APIS["chat"].judge(stream)
    await run_batch(HOST, port, workload.batch(port, stream, 200), 8, judge)
    while (await writer_backlog(port)) not in (0, None):
        await asyncio.sleep(0.1)
    sent = 0

    async def load() -> None:
        nonlocal sent
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            batch = workload.batch(port, stream, 200)
            result = await run_batch(HOST, port, batch, concurrency, judge)
            if result.errors:
                raise RuntimeError(result.first_error)
            sent += len(batch)

    task = asyncio.create_task(load())
    started = time.monotonic()
    peak = 0
    while not task.done():
        await asyncio.sleep(0.5)
        backlog = await writer_backlog(port) or 0
        peak = max(peak, backlog)
        print(f"  t={time.monotonic() - started:5.1f} s  sent {sent:6d}  backlog {backlog:6d}")
    await task
    done_at = time.monotonic()
    load_s = done_at - started
    at_end = await writer_backlog(port) or 0
    while (await writer_backlog(port)) not in (0, None):
        await asyncio.sleep(0.1)
    drain_s = time.monotonic() - done_at
    return {
        "load_s": round(load_s, 2),
        "calls": sent,
        "records_per_s_submitted": round(3 * sent / load_s),
        "backlog_at_end": at_end,
        "peak_backlog": max(peak, at_end),
        "drain_s": round(drain_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--switch-interval", type=float)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="talaria-writer-lag-"))
    port = free_port()
    cmd = [sys.executable, str(SERVERS), "talaria", "--port", str(port)]
    cmd += ["--db", str(workdir / "talaria.db")]
    if args.switch_interval is not None:
        cmd += ["--switch-interval", str(args.switch_interval)]
    server = start_server("talaria", cmd, port, workdir)
    try:
        wait_ready(server, "/healthz", 60)
        summary = asyncio.run(probe(port, args.seconds, args.concurrency, args.stream))
    finally:
        stop_server(server)
    print(summary)


if __name__ == "__main__":
    main()
