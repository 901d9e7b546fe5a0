"""The measurement of ``bench/proxy_overhead.py``: the requests of a batch (``Workload``), a
batch run against one server with its CPU time, the warm-up, and the rounds over every
workload, concurrency, mode and server (``measure``), summed into a ``Cell`` each."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from overhead.apis import APIS, Api
from overhead.client import BatchResult, Connection, encode_post, run_batch
from overhead.litellm_proxy import MASTER_KEY
from overhead.procs import HOST, TICK_S, Server, main_thread_cpu_s, proc_tree_cpu_s

REPLY_TOKENS = 12
TALARIA = ("talaria", "talaria-async")
"""The proxy's two durability modes: commit (the default) and async."""
MODES = ("json", "stream")


class Workload:
    """Batch ``b`` of ``n`` requests: request ``i`` is call ``i // sessions`` of session
    ``i % sessions`` (``b``-tagged ids, so every batch has sessions of its own); a session's
    calls are ``sessions`` requests apart, so they never overlap at the concurrencies used."""

    def __init__(self, requests: int, calls_per_session: int, api: Api) -> None:
        self.n = requests
        self.calls = calls_per_session
        self.api = api
        self.sessions = max(1, -(-requests // calls_per_session))
        self._batch = 0

    def batch(self, port: int, stream: bool, n: int | None = None) -> list[bytes]:
        self._batch += 1
        tag = f"ov{os.getpid()}-{self.api.name}-{self._batch}"
        out = []
        for i in range(n or self.n):
            session, call = i % self.sessions, (i // self.sessions) % self.calls
            headers = {
                "Authorization": f"Bearer {MASTER_KEY}",
                "X-Talaria-Session-Id": f"{tag}-{session}",
            }
            if call == self.calls - 1:
                headers["X-Talaria-Session-Final"] = "true"
            body = self.api.body(session, call, stream)
            out.append(encode_post(HOST, port, self.api.path, body, headers))
        return out


@dataclass
class Cell:
    """One (mode, concurrency, target): the batches of every round."""

    latencies_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    requests: int = 0
    server_cpu_s: float = 0.0
    server_main_thread_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    rounds: list[dict[str, float | None]] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


async def settle(pid: int, min_s: float, max_s: float = 30.0) -> float:
    """Wait until the server is idle again (its CPU time grew by at most one clock tick in each
    of two successive 0.1 s windows), at least ``min_s``: work left over from a batch (the
    batched writer catching up) belongs to that batch. Returns the seconds waited."""
    started = time.monotonic()
    await asyncio.sleep(min_s)
    last, quiet = proc_tree_cpu_s(pid), 0
    while quiet < 2 and time.monotonic() - started < max_s:
        await asyncio.sleep(0.1)
        now = proc_tree_cpu_s(pid)
        quiet = quiet + 1 if now - last <= TICK_S * 1.01 else 0
        last = now
    return time.monotonic() - started


async def writer_backlog(port: int) -> int | None:
    """``talaria_store_pending_records`` from the proxy's /metrics (None if unreadable)."""
    conn = Connection(HOST, port)
    try:
        request = f"GET /metrics HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode()
        _, body = await conn.request(request)
    except (OSError, asyncio.IncompleteReadError, ValueError):
        return None
    finally:
        await conn.close()
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("talaria_store_pending_records "):
            return int(float(line.split()[1]))
    return None


async def measured_batch(
    server: Server,
    requests: list[bytes],
    concurrency: int,
    judge: Any,
    settle_s: float,
) -> tuple[BatchResult, float, float, int | None]:
    """The batch; the server's CPU seconds (process tree, until it is idle again) and its main
    thread's; for talaria, the batched writer's backlog when the last reply arrived."""
    pid = server.proc.pid
    cpu0, main0 = proc_tree_cpu_s(pid), main_thread_cpu_s(pid)
    result = await run_batch(HOST, server.port, requests, concurrency, judge)
    backlog = await writer_backlog(server.port) if server.name in TALARIA else None
    await settle(pid, settle_s)
    return result, proc_tree_cpu_s(pid) - cpu0, main_thread_cpu_s(pid) - main0, backlog


async def warm_up(server: Server, workload: Workload, n: int, modes: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for mode in modes:
        stream = mode == "stream"
        requests = workload.batch(server.port, stream, n)
        judge = workload.api.judge(stream)
        result = await run_batch(HOST, server.port, requests, 8, judge, keep_bodies=True)
        if result.errors:
            raise RuntimeError(
                f"{server.name} warm-up ({workload.api.name} {mode}): {result.first_error}"
            )
        validate = workload.api.validate
        shapes = {json.dumps(validate(stream, body, REPLY_TOKENS)) for _, body in result.bodies}
        summary[mode] = [json.loads(s) for s in sorted(shapes)]
    return summary


async def idle_cpu(server: Server, seconds: float) -> float:
    cpu0 = proc_tree_cpu_s(server.proc.pid)
    await asyncio.sleep(seconds)
    return (proc_tree_cpu_s(server.proc.pid) - cpu0) / seconds


def serves(server: Server, api: Api) -> bool:
    """LiteLLM's proxy is measured on chat completions only (of every body size)."""
    return server.name != "litellm" or api.path == APIS["chat"].path


async def measure(
    servers: list[Server], workloads: list[Workload], args: argparse.Namespace
) -> dict[tuple[str, str, int, str], Cell]:
    cells: dict[tuple[str, str, int, str], Cell] = {}
    started = time.monotonic()
    for workload in workloads:
        api = workload.api
        order = [s for s in servers if serves(s, api)]
        for concurrency in args.concurrency:
            for round_no in range(args.rounds):
                for mode in args.modes:
                    stream = mode == "stream"
                    for server in order:
                        requests = workload.batch(server.port, stream)
                        result, cpu, main_cpu, backlog = await measured_batch(
                            server, requests, concurrency, api.judge(stream), args.settle_s
                        )
                        if result.errors:
                            raise RuntimeError(
                                f"{server.name} {api.name} {mode} c={concurrency} round "
                                f"{round_no}: {result.errors}/{len(requests)} requests failed; "
                                f"first: {result.first_error}"
                            )
                        if not server.alive():
                            raise RuntimeError(f"{server.name} died:\n{server.log_tail()}")
                        key = (api.name, mode, concurrency, server.name)
                        cell = cells.setdefault(key, Cell())
                        cell.latencies_s += result.latencies_s
                        cell.wall_s += result.wall_s
                        cell.requests += len(requests)
                        cell.server_cpu_s += cpu
                        cell.server_main_thread_cpu_s += main_cpu
                        cell.client_cpu_s += result.client_cpu_s
                        rps = len(requests) / result.wall_s
                        p50_ms = percentile(result.latencies_s, 0.5) * 1e3
                        cell.rounds.append(
                            {
                                "round": round_no,
                                "rps": rps,
                                "p50_ms": p50_ms,
                                "p99_ms": percentile(result.latencies_s, 0.99) * 1e3,
                                "server_cpu_ms_per_req": cpu / len(requests) * 1e3,
                                "client_cpu_ms_per_req": result.client_cpu_s / len(requests) * 1e3,
                                "writer_backlog_at_end": backlog,
                            }
                        )
                        print(
                            f"  [{time.monotonic() - started:6.1f} s] {api.name:<9} "
                            f"c={concurrency:<3} round {round_no} {mode:<6} {server.name:<8} "
                            f"{rps:8.1f} req/s  p50 {p50_ms:7.2f} ms  "
                            f"cpu {cpu / len(requests) * 1e3:6.2f} ms/req",
                            flush=True,
                        )
                    order = order[1:] + order[:1]
    return cells
