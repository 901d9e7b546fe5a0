"""What a call costs when it reaches a replica that does not own its session.

Real processes on loopback: a throwaway PostgreSQL, one ``talaria runtime`` (a simulated engine
at 1000× real time, so the engine adds almost nothing), and two proxy replicas A and B sharing
the database. Every session is owned by A (ids chosen by the same rendezvous hash the replicas
use). One phase sends each session's calls to A (served where they land), the other to B
(forwarded to A, the answer streamed back). Sequential calls, one at a time:

    .venv/bin/python bench/forward_cost.py [--sessions 20 --calls 20]

It prints per phase: latency p50 / p99, and each replica's CPU per call (user + system time of
its process, from /proc, over the phase).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.harness.processes import (  # noqa: E402
    Postgres,
    ServeProcess,
    free_port,
    talaria_runtime,
    talaria_serve,
)
from talaria.proxy.cluster.owner import owner, route_key  # noqa: E402

MODEL = "glm-4.5-fp8"
TENANT = "local"  # loopback callers without a key (docs/operations.md, Security model)
NODE = """
[node]
name = "node-0"
policy = "talaria"
time_scale = 1000

[[model]]
name = "glm-4.5-fp8"
engine = "sim"
"""


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def session_ids(n: int, replicas: list[str], wanted: str) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        candidate = f"fwd-{uuid.uuid4().hex[:10]}"
        key = route_key(TENANT, candidate, None)
        assert key is not None
        if owner(key, replicas) == wanted:
            out.append(candidate)
    return out


def phase(
    target: ServeProcess, ids: list[str], calls: int, replicas: dict[str, ServeProcess]
) -> dict[str, Any]:
    latencies: list[float] = []
    forwarded = 0
    before = {name: cpu_s(r.process.pid) for name, r in replicas.items()}
    with httpx.Client(base_url=target.base_url, timeout=60) as client:
        for sid in ids:
            messages: list[dict[str, str]] = [{"role": "user", "content": f"task {sid}"}]
            for i in range(calls):
                started = time.perf_counter()
                response = client.post(
                    "/v1/chat/completions",
                    json={"model": MODEL, "messages": messages, "max_tokens": 8},
                    headers={"x-talaria-session-id": sid},
                )
                latencies.append(time.perf_counter() - started)
                response.raise_for_status()
                forwarded += "x-talaria-replica" in response.headers
                reply = response.json()["choices"][0]["message"]["content"] or ""
                messages += [
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": f"step {i}"},
                ]
    n = len(latencies)
    cpu = {name: (cpu_s(r.process.pid) - before[name]) / n * 1e3 for name, r in replicas.items()}
    quantiles = statistics.quantiles(latencies, n=100)
    return {
        "calls": n,
        "forwarded": forwarded,
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": quantiles[98] * 1e3,
        "cpu_ms_per_call": cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--calls", type=int, default=20, help="calls per session")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="talaria-fwd-"))
    pg = Postgres(Path(tempfile.mkdtemp(prefix="talaria-pg-")), free_port())  # postgres reads it
    url = pg.start()
    try:
        with ExitStack() as stack:
            (work / "node.toml").write_text(NODE)
            runtime = stack.enter_context(talaria_runtime(work / "node.toml"))
            replicas: dict[str, ServeProcess] = {}
            secret = secrets.token_urlsafe(32)  # the replicas sign their forwards with it
            for name in ("A", "B"):
                port = free_port()
                data = work / name
                data.mkdir()
                env = {
                    "TALARIA_REPLICA_URL": f"http://127.0.0.1:{port}",
                    "TALARIA_CLUSTER_SECRET": secret,
                }
                args_ = ["--database-url", url, "--runtime", runtime.base_url]
                replicas[name] = stack.enter_context(talaria_serve(args_, env, data, port=port))
            for served in replicas.values():  # both see each other before the first call
                while not httpx.get(served.base_url + "/readyz").json()["checks"]["replicas"][
                    "peers"
                ]:
                    pass
            names = [r.base_url for r in replicas.values()]
            ids = session_ids(2 * args.sessions, names, replicas["A"].base_url)
            print("warming up", file=sys.stderr)
            phase(replicas["B"], ids[:2], 5, replicas)
            report = {
                "to the owner (A)": phase(
                    replicas["A"], ids[2 : args.sessions], args.calls, replicas
                ),
                "to the other replica (B → A)": phase(
                    replicas["B"], ids[args.sessions + 2 :], args.calls, replicas
                ),
            }
    finally:
        pg.stop()
        shutil.rmtree(pg.directory, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    print("| sent | calls | forwarded | p50 ms | p99 ms | CPU ms/call A | CPU ms/call B |")
    print("|---|---|---|---|---|---|---|")
    for label, r in report.items():
        cpu = r["cpu_ms_per_call"]
        print(
            f"| {label} | {r['calls']} | {r['forwarded']} | {r['p50_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {cpu['A']:.2f} | {cpu['B']:.2f} |"
        )
    direct, via = report.values()
    print(
        f"forwarding adds {via['p50_ms'] - direct['p50_ms']:+.2f} ms at p50, "
        f"{via['p99_ms'] - direct['p99_ms']:+.2f} ms at p99, and "
        f"{sum(via['cpu_ms_per_call'].values()) - sum(direct['cpu_ms_per_call'].values()):+.2f}"
        " ms of proxy CPU per call"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
