"""What bench/cluster_live.py measures of a run: the CPU time of every replica, runtime and
PostgreSQL process and of the driver (/proc), what the store kept (sessions, KV sources, the
engines' time), and the run's figures (``summarize``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.harness.processes import child_pids
from bench.harness.trace_drive import SessionResult
from talaria.proxy.store.db import make_engine
from talaria.sim.metrics import percentile

TICK_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK_S  # utime, stime


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU jiffies of the whole machine, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    total = sum(values[:8])
    return total - idle, total


@dataclass
class CpuSnapshot:
    replicas: list[float]
    runtimes: float
    postgres: dict[int, float]
    driver: float
    machine: tuple[float, float]

    @classmethod
    def take(cls, replicas: list[int], runtimes: list[int], pg_master: int | None) -> CpuSnapshot:
        pg = [pg_master, *child_pids(pg_master)] if pg_master else []
        own = os.times()
        return cls(
            [cpu_s(p) for p in replicas],
            sum(cpu_s(p) for p in runtimes),
            {p: cpu_s(p) for p in pg},
            own.user + own.system,
            machine_busy(),
        )


async def store_summary(url: str, scale: float) -> dict[str, Any]:
    """What the replicas recorded: sessions per client id, calls by KV source and routing
    reason, and the engines' own time of the calls (simulated seconds, summed)."""
    engine = make_engine(url)
    try:
        async with engine.connect() as db:

            async def rows(query: str) -> list[Any]:
                return list(await db.execute(text(query)))

            sessions = (await rows("SELECT count(*), count(DISTINCT session_id) FROM sessions"))[0]
            kv = await rows("SELECT coalesce(kv_source, '-'), count(*) FROM calls GROUP BY 1")
            reasons = await rows("SELECT reason, count(*) FROM routing_decisions GROUP BY 1")
            totals = (
                await rows(
                    "SELECT count(*), sum(coalesce(queue_s, 0)), sum(coalesce(slot_wait_s, 0)), "
                    "sum(coalesce(prefill_s, 0)), sum(coalesce(decode_s, 0)), "
                    "sum(extract(epoch FROM finished_at - arrived_at)), sum(prompt_tokens), "
                    "sum(cached_tokens), sum(output_tokens) FROM calls WHERE status = 'ok'"
                )
            )[0]
    finally:
        await engine.dispose()
    ok = int(totals[0]) or 1
    return {
        "sessions": int(sessions[0]),
        "client_session_ids": int(sessions[1]),
        "calls_by_kv_source": {k: int(n) for k, n in kv},
        "routing_reasons": {k: int(n) for k, n in reasons},
        "ok_calls": int(totals[0]),
        "mean_queue_s": float(totals[1] or 0) * scale / ok,
        "mean_slot_wait_s": float(totals[2] or 0) * scale / ok,
        "mean_prefill_s": float(totals[3] or 0) * scale / ok,
        "mean_decode_s": float(totals[4] or 0) * scale / ok,
        "mean_latency_s": float(totals[5] or 0) * scale / ok,
        "prompt_tokens": int(totals[6] or 0),
        "cached_tokens": int(totals[7] or 0),
        "output_tokens": int(totals[8] or 0),
    }


def summarize(
    replicas: int,
    results: list[SessionResult],
    before: CpuSnapshot,
    after: CpuSnapshot,
    wall_s: float,
    scale: float,
) -> dict[str, Any]:
    calls = sum(r.calls for r in results)
    failures = sum(len(r.failures) for r in results)
    sct = [r.sct_wall_s * scale for r in results]
    waiting = [r.call_wall_s * scale for r in results]
    late = [r.sct_wall_s * scale - r.call_wall_s * scale - r.tool_s for r in results]
    replica_cpu = [a - b for a, b in zip(after.replicas, before.replicas, strict=True)]
    pg_cpu = sum(v - before.postgres.get(p, 0.0) for p, v in after.postgres.items())
    busy = after.machine[0] - before.machine[0]
    total = after.machine[1] - before.machine[1]
    ours = sum(replica_cpu) + after.runtimes - before.runtimes + pg_cpu + after.driver
    ours -= before.driver
    return {
        "replicas": replicas,
        "sessions": len(results),
        "calls": calls,
        "failures": failures,
        "failure_examples": [f for r in results for f in r.failures][:10],
        "forwarded_calls": sum(r.forwarded for r in results),
        "p50_sct_s": percentile(sct, 50),
        "p95_sct_s": percentile(sct, 95),
        "mean_sct_s": sum(sct) / len(sct),
        "p50_call_time_s": percentile(waiting, 50),
        "p50_sleep_overshoot_s": percentile(late, 50),
        "wall_s": wall_s,
        "proxy_cpu_s": sum(replica_cpu),
        "proxy_cpu_s_per_replica": replica_cpu,
        "proxy_cpu_ms_per_call": 1000 * sum(replica_cpu) / calls,
        "runtime_cpu_s": after.runtimes - before.runtimes,
        "postgres_cpu_s": pg_cpu,
        "driver_cpu_s": after.driver - before.driver,
        "machine_busy": busy / total if total else math.nan,
        "other_cpu_s": busy / TICK_S - ours,
        "cores": os.cpu_count(),
        "sct_s": {r.session_id: s for r, s in zip(results, sct, strict=True)},
        "call_time_s": {r.session_id: w for r, w in zip(results, waiting, strict=True)},
    }
