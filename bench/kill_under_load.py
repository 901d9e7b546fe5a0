"""How many acknowledged calls a kill -9 under load loses, per durability mode.

    .venv/bin/python bench/kill_under_load.py [--durability commit,async] [--runs 3] \\
        [--kill-at 300] [--sessions 400]

For each mode and run: ``talaria serve`` (embedded simulated runtime, one model, 100× real
time, a fresh SQLite file) under the load of tests/e2e/loadgen.py (32 concurrent sessions of 3
calls, chat / Messages / Responses, streaming and not), SIGKILL once ``--kill-at`` calls were
acknowledged (a 200 whose body arrived whole), then count the acknowledged calls whose ``ok``
row is missing. tests/e2e/test_reliability.py asserts 0 for the default, ``commit``. Results:
docs/operations.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/harness

from sqlalchemy import text

from bench.harness.loadgen import run_load
from bench.harness.processes import talaria_serve
from talaria.proxy.store.db import make_engine

MODEL = "glm-4.5-fp8"


async def _ok_rows(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        async with engine.connect() as db:
            rows = await db.execute(text("SELECT request_id FROM calls WHERE status = 'ok'"))
            return {r[0] for r in rows}
    finally:
        await engine.dispose()


def one_run(durability: str, kill_at: int, sessions: int, seed: int) -> tuple[int, int]:
    """(acknowledged, lost)."""
    folder = Path(tempfile.mkdtemp(prefix="talaria-kill-"))
    url = f"sqlite+aiosqlite:///{folder / 'kill.db'}"
    args = ["--models", MODEL, "--time-scale", "100", "--database-url", url]
    with talaria_serve(args, {"TALARIA_DURABILITY": durability}, folder) as served:

        def kill(acked: int) -> None:
            if acked == kill_at and served.process.poll() is None:
                served.kill9()

        load = asyncio.run(
            run_load(served.base_url, MODEL, sessions=sessions, seed=seed, on_ack=kill)
        )
    stored = asyncio.run(_ok_rows(url))
    return len(load.acked), len(set(load.acked) - stored)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--durability", default="commit,async")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kill-at", type=int, default=300)
    parser.add_argument("--sessions", type=int, default=400)
    args = parser.parse_args()
    print("| durability | run | acknowledged | lost |")
    print("|---|---|---|---|")
    for mode in args.durability.split(","):
        for run in range(args.runs):
            acked, lost = one_run(mode, args.kill_at, args.sessions, seed=run)
            print(f"| {mode} | {run} | {acked} | {lost} |", flush=True)


if __name__ == "__main__":
    main()
