"""The proxy's own CPU per call, in-process: the ASGI app driven directly (no sockets, no HTTP
parser, no client), with and without the call lanes (proxy/edge/lanes.py), alternating.

    .venv/bin/python bench/call_path.py --kb 2,128 --calls 2000 --pairs 4

Each run builds the app of bench/overhead/servers.py (an ``InstantRuntime``, SQLite at a
temporary path, ``--durability``), starts its lifespan, warms it with 200 calls, then drives
``--calls`` chat completions of bench/overhead/apis.py's agent shape (sessions of 4 calls
named by ``X-Talaria-Session-Id``, the last one final) from ``--concurrency`` tasks, and reads
the process's CPU time (every thread: the writer's too) around them. Each run is a process of
its own; the two variants alternate ``--pairs`` times, so a machine whose speed drifts hits
both alike. Prints CPU ms per call of every run, then the median of each variant.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _scope(raw: bytes, session: str, final: bool) -> dict[str, Any]:
    headers = [
        (b"host", b"bench"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(raw)).encode()),
        (b"x-talaria-session-id", session.encode()),
    ]
    if final:
        headers.append((b"x-talaria-session-final", b"true"))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }


async def _call(app: Any, raw: bytes, session: str, final: bool) -> None:
    """One call through the app; fails unless it is answered 200."""
    sent: list[dict[str, Any]] = []
    delivered = False
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await never.wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(_scope(raw, session, final), receive, send)
    if sent[0]["status"] != 200:
        raise RuntimeError(f"answered {sent[0]['status']}: {sent[1:]}")


async def _drive(kb: int, calls: int, concurrency: int, durability: str, lanes: bool) -> float:
    """CPU ms per call of one run (module docstring)."""
    from overhead.apis import agent_chat_body
    from overhead.servers import talaria_app

    import talaria.proxy.edge.app as proxy_app

    create = proxy_app.create_app
    proxy_app.create_app = lambda *a, **k: create(*a, call_lanes=lanes, **k)  # type: ignore[assignment]
    db = Path(tempfile.mkdtemp()) / "bench.db"
    app = talaria_app(str(db), 12, durability)
    sessions = calls // 4
    bodies = [[agent_chat_body(s, c, False, kb * 1024) for c in range(4)] for s in range(sessions)]
    async with app.router.lifespan_context(app):
        for s in range(50):
            for c in range(4):
                await _call(app, agent_chat_body(10**6 + s, c, False, kb * 1024), f"w{s}", c == 3)
        todo = list(range(sessions))

        async def worker() -> None:
            while todo:
                s = todo.pop()
                for c in range(4):
                    await _call(app, bodies[s][c], f"s{s}", c == 3)

        started = time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        used = time.process_time() - started
    return 1e3 * used / (sessions * 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb", default="2,128", help="comma-separated body sizes in KB")
    parser.add_argument("--calls", type=int, default=2000, help="calls per run")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=4, help="runs of each variant, alternating")
    parser.add_argument("--durability", choices=("commit", "async"), default="async")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # "KB,lanes": one run, in this process
    args = parser.parse_args()
    if args.run:
        import uvloop  # the proxy's loop, as `talaria serve` runs it

        kb, lanes = args.run.split(",")
        ms = uvloop.run(
            _drive(int(kb), args.calls, args.concurrency, args.durability, lanes == "1")
        )
        print(f"{ms:.4f}")
        return
    for kb in (int(k) for k in args.kb.split(",")):
        found: dict[bool, list[float]] = {True: [], False: []}
        for pair in range(args.pairs):
            for lanes in (True, False):
                out = subprocess.run(
                    [sys.executable, __file__, "--run", f"{kb},{int(lanes)}",
                     "--calls", str(args.calls), "--concurrency", str(args.concurrency),
                     "--durability", args.durability],
                    check=True, capture_output=True, text=True, env={**os.environ},
                )  # fmt: skip
                ms = float(out.stdout.split()[-1])
                found[lanes].append(ms)
                print(f"{kb} KB  pair {pair}  lanes {'on ' if lanes else 'off'}  {ms:.3f} ms/call")
        on, off = statistics.median(found[True]), statistics.median(found[False])
        print(f"{kb} KB  median: lanes on {on:.3f}, off {off:.3f} ms/call ({off - on:+.3f} saved)")


if __name__ == "__main__":
    main()
