"""The HTTP client of the proxy's hops: httpx against aiohttp, CPU per call.

    .venv/bin/python bench/http_clients.py                  # 128 KB bodies, concurrency 1 and 16
    .venv/bin/python bench/http_clients.py --kb 2,128,400 --calls 1000

What the runtime hop (proxy/runtimes/http.py) and the forwarding hop (proxy/cluster/forward.py)
do on every call: POST a JSON body of ``--kb`` KB and read an NDJSON answer of five lines,
on kept-alive connections, ``--calls`` times at each concurrency, against a bare
Starlette/uvicorn server (uvloop, httptools) in a child process. Reported: this process's CPU
(user + sys) per call, and the wall time per call. Both clients run on uvloop, one after the
other, after 20 warm-up calls each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpx
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/harness

from bench.harness.processes import free_port

SERVER = """
import sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

async def generate(request):
    body = await request.body()
    async def lines():
        for i in range(4):
            yield b'{"type":"token","n":%d}\\n' % i
        yield b'{"type":"finished","bytes":%d}\\n' % len(body)
    return StreamingResponse(lines(), media_type="application/x-ndjson")

app = Starlette(routes=[Route("/generate", generate, methods=["POST"])])
uvicorn.run(app, port=int(sys.argv[1]), log_level="warning", loop="uvloop", http="httptools")
"""

Call = Callable[[], Awaitable[None]]


def body(kb: int) -> bytes:
    """A chat-shaped JSON body of about ``kb`` KB (2 KB messages)."""
    messages = [{"role": "user", "content": "x" * 2000}] * max(1, kb // 2)
    return json.dumps({"messages": messages}).encode()


async def measure(call: Call, calls: int, concurrency: int) -> tuple[float, float]:
    """(CPU ms per call, wall ms per call) over ``calls`` calls, ``concurrency`` at once."""
    for _ in range(20):
        await call()
    gate = asyncio.Semaphore(concurrency)

    async def gated() -> None:
        async with gate:
            await call()

    wall0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(gated() for _ in range(calls)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return 1000 * cpu / calls, 1000 * wall / calls


async def with_httpx(url: str, data: bytes, calls: int, concurrency: int) -> tuple[float, float]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def call() -> None:
            headers = {"content-type": "application/json"}
            async with client.stream("POST", "/generate", content=data, headers=headers) as r:
                async for _line in r.aiter_lines():
                    pass

        return await measure(call, calls, concurrency)


async def with_aiohttp(url: str, data: bytes, calls: int, concurrency: int) -> tuple[float, float]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(url, connector=connector) as session:

        async def call() -> None:
            headers = {"content-type": "application/json"}
            async with session.post("/generate", data=data, headers=headers) as r:
                async for _chunk in r.content.iter_any():
                    pass

        return await measure(call, calls, concurrency)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb", default="128", help="body sizes in KB, comma-separated")
    parser.add_argument("--concurrency", default="1,16", help="comma-separated")
    parser.add_argument("--calls", type=int, default=600, help="calls per measurement")
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):  # until it listens
            try:
                httpx.post(url + "/generate", content=b"{}", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        print("| body | concurrency | client | CPU ms/call | wall ms/call |")
        print("|---|---|---|---|---|")
        for kb in (int(k) for k in args.kb.split(",")):
            data = body(kb)
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                for name, run in (("httpx", with_httpx), ("aiohttp", with_aiohttp)):
                    cpu, wall = uvloop.run(run(url, data, args.calls, concurrency))
                    size = f"{len(data) // 1024} KB"
                    print(f"| {size} | {concurrency} | {name} | {cpu:.3f} | {wall:.3f} |")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
