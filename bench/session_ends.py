"""What 12,000 conversations leave on a node, and what they cost another tenant (issue 46).

    .venv/bin/python bench/session_ends.py [--sessions 120] [--conversations 100] \\
        [--concurrency 8] [--probes 200] [--time-scale 100] [--json out/session-ends.json]

Real processes: ``talaria runtime`` (one simulated node of glm-4.5-fp8 on h200x8, time ×
``--time-scale``) and ``talaria serve`` in front of it over HTTP, on SQLite, with an API key
for each of two tenants:

1. **probe** (before; after 20 calls not counted): the other tenant's ``--probes`` calls,
   one after another, each a session of its own that its call ends
   (``X-Talaria-Session-Final``); its p50 / p95 wall latency;
2. **load**: ``--sessions`` sessions of the load tenant, ``--concurrency`` at a time, each
   opening ``--conversations`` conversations (a distinct first message each, under its one
   session id: past the 64-thread cap the oldest are retired), then ended by its client
   (``POST /v1/sessions/<id>/end``);
3. **probe** (after), as 1.

Printed: the node's status (its ``sessions`` entries, the document's bytes) before the load,
after it, and the probe's latency before and after. Before issue 46 every thread ≥ 1's end was
a 404, so the entries stayed (the finding: 14,018 after 12,000 conversations, the status 0.6 →
2.1 MB, the other tenant's p50 55 → 221 ms). Run it on another checkout with ``PYTHONPATH`` at
it to compare (the ``talaria`` processes import from there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from bench.harness.processes import talaria_runtime, talaria_serve, tenant_key

MODEL = "glm-4.5-fp8"
NODE_TOML = """[node]
name = "n0"
policy = "talaria"
quantum_s = 60
time_scale = {scale}
server = "h200x8"

[[model]]
name = "{model}"
engine = "sim"
"""


def create_keys(data: Path) -> dict[str, str]:
    """An API key for each tenant (probe, load) in the store of the proxy at ``data``."""
    url = f"sqlite+aiosqlite:///{data / 'talaria.db'}"
    return {tenant: tenant_key(url, tenant) for tenant in ("probe", "load")}


def body(text: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 16,
    }


async def probe(client: httpx.AsyncClient, key: str, calls: int, tag: str) -> dict[str, float]:
    """``calls`` calls of the probe tenant one after another: p50 / p95 wall ms."""
    latencies = []
    for n in range(calls):
        headers = {
            "authorization": f"Bearer {key}",
            "x-session-id": f"probe-{tag}-{n}",
            "x-talaria-session-final": "true",
        }
        start = time.perf_counter()
        answer = await client.post("/v1/chat/completions", json=body(f"probe {n}"), headers=headers)
        latencies.append(time.perf_counter() - start)
        answer.raise_for_status()
    ordered = sorted(latencies)
    return {
        "p50_ms": round(statistics.median(ordered) * 1e3, 1),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))] * 1e3, 1),
    }


async def load(
    client: httpx.AsyncClient, key: str, sessions: int, conversations: int, concurrency: int
) -> int:
    """The load tenant's sessions (module docstring); the calls that failed."""
    failed = 0
    gate = asyncio.Semaphore(concurrency)

    async def session(s: int) -> None:
        nonlocal failed
        async with gate:
            headers = {"authorization": f"Bearer {key}", "x-session-id": f"load-{s}"}
            for c in range(conversations):
                text = f"session {s}, conversation {c}: make tests/test_{c}.py pass"
                answer = await client.post("/v1/chat/completions", json=body(text), headers=headers)
                failed += answer.status_code != 200
            ended = await client.post(f"/v1/sessions/load-{s}/end", headers=headers)
            failed += ended.status_code != 200

    await asyncio.gather(*(session(s) for s in range(sessions)))
    return failed


def node_status(url: str) -> dict[str, int]:
    """The runtime's status document: its session entries and its size."""
    raw = httpx.get(url + "/v1/runtime/status", timeout=60).content
    return {"kv_entries": len(json.loads(raw)["sessions"]), "status_bytes": len(raw)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=120)
    parser.add_argument("--conversations", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--time-scale", type=float, default=100.0)
    parser.add_argument("--json", type=Path, default=Path("out/session-ends.json"))
    args = parser.parse_args()
    doc: dict[str, Any] = {"command": " ".join(sys.argv)}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        data = folder / "data"
        data.mkdir()
        keys = create_keys(data)
        config = folder / "n0.toml"
        config.write_text(NODE_TOML.format(scale=args.time_scale, model=MODEL))
        runtime = stack.enter_context(talaria_runtime(config))
        serve = ["--runtime", runtime.base_url, "--time-scale", str(args.time_scale)]
        env = {"TALARIA_DATABASE_URL": f"sqlite+aiosqlite:///{data / 'talaria.db'}"}
        proxy = stack.enter_context(talaria_serve(serve, env, data))

        async def drive() -> None:
            limits = httpx.Limits(max_connections=args.concurrency + 2)
            async with httpx.AsyncClient(
                base_url=proxy.base_url, timeout=600, limits=limits
            ) as client:
                await probe(client, keys["probe"], 20, "warm-up")  # not counted
                doc["probe_before"] = await probe(client, keys["probe"], args.probes, "a")
                doc["node_before"] = node_status(runtime.base_url)
                started = time.perf_counter()
                doc["load_failed_calls"] = await load(
                    client, keys["load"], args.sessions, args.conversations, args.concurrency
                )
                doc["load_s"] = round(time.perf_counter() - started, 1)
                doc["node_after"] = node_status(runtime.base_url)
                doc["probe_after"] = await probe(client, keys["probe"], args.probes, "b")

        asyncio.run(drive())
    before, after = doc["probe_before"], doc["probe_after"]
    print(f"conversations: {args.sessions * args.conversations:,} in {doc['load_s']} s")
    print(f"failed calls: {doc['load_failed_calls']}")
    print("| | node KV entries | status bytes | probe p50 / p95 ms |")
    print("|---|---|---|---|")
    for when, node, probe_ms in (
        ("before", doc["node_before"], before),
        ("after", doc["node_after"], after),
    ):
        print(
            f"| {when} | {node['kv_entries']:,} | {node['status_bytes']:,} | "
            f"{probe_ms['p50_ms']} / {probe_ms['p95_ms']} |"
        )
    print(f"p50 after ÷ before: {after['p50_ms'] / before['p50_ms']:.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
