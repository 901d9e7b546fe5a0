"""Does a client killed with calls in flight stall another tenant's calls? (the 660 s finding)

    .venv/bin/python bench/abandoned_stall.py [--rounds 5] [--sessions 0] [--tenants 2] \\
        [--time-scale 1000] [--idle-timeout-s 30] [--victim-calls 12] [--profile] \\
        [--log out/abandoned-stall.log] [--json out/abandoned-stall.json]

One ``talaria serve`` (embedded simulated node hosting qwen3-235b-a22b-bf16 and
qwen3-coder-480b-a35b-fp8, which cannot be resident together; SQLite; ``--time-scale``;
``TALARIA_SESSION_IDLE_TIMEOUT_S`` = ``--idle-timeout-s``), API keys for ``--tenants`` bulk
tenants, a victim tenant and a probe tenant (``talaria keys create``). Then:

1. ``--sessions`` live sessions of the bulk tenants, half implicit and half named by their
   client, one call each (``--concurrency`` at a time);
2. each round: a client process of the victim tenant sends ``--victim-calls`` calls, half
   streaming, each asking for most of the coder's 262,144-token window with ``ignore_eos`` (so
   that only 8 fit in HBM at once and the rest wait for memory), and is killed (SIGKILL)
   ``--hold-s`` after it sent them; with ``--warm`` each runs in a session of its own, named,
   whose short first call (the same prompt) finished before;
3. then ``--probes`` calls: new implicit sessions of the probe tenant on the other model, one
   at a time, each timed (its switch needs the coder's calls to drain). A probe slower than
   ``--stall-s`` is a stall: the node's state is read from ``/admin/instances`` and, with
   ``--profile``, the server's stacks are dumped with ``py-spy dump``.

The server's log goes to ``--log``, everything seen to ``--json``. A probe that times out
(status 0) waited ``--probe-timeout-s``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/harness

import httpx

from bench.harness.processes import ServeProcess, talaria_serve, tenant_key

HOLDER = "qwen3-coder-480b-a35b-fp8"
"""The victim's model: 66.6 GB of KV per full-window call, 8 fit beside its weights."""
PROBE = "qwen3-235b-a22b-bf16"
"""The probe's model: it cannot be resident with the victim's, so it waits for a drain."""
ADMIN_TOKEN = "stall-admin-token-0123456789"
SYSTEM = "You are a coding agent. Read, edit and test the repository with the tools. " * 8
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]

VICTIM = r"""
import asyncio, sys
import httpx

async def victim() -> None:
    base, key, model, calls, max_tokens, tag, warm = sys.argv[1:8]
    async with httpx.AsyncClient(base_url=base, timeout=None) as client:
        def call(i: int) -> tuple[dict[str, str], list[dict[str, str]]]:
            headers = {"Authorization": f"Bearer {key}"}
            if warm == "1":
                headers["X-Talaria-Session-Id"] = f"victim-{tag}-{i}"
            return headers, [{"role": "user", "content": f"victim {tag} call {i}: write it all"}]

        async def short(i: int) -> None:  # the long call is its retry: the same session
            headers, messages = call(i)
            body = {"model": model, "messages": messages, "max_tokens": 8}
            await client.post("/v1/chat/completions", json=body, headers=headers)

        async def one(i: int) -> None:
            headers, messages = call(i)
            body = {
                "model": model,
                "messages": messages,
                "max_tokens": int(max_tokens),
                "ignore_eos": True,
                "stream": i % 2 == 1,
            }
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=headers
            ) as response:
                async for _ in response.aiter_bytes():
                    pass

        if warm == "1":  # bounded: on a stuck node they might never end
            shorts = [asyncio.create_task(short(i)) for i in range(int(calls))]
            await asyncio.wait(shorts, timeout=60)
        tasks = [asyncio.create_task(one(i)) for i in range(int(calls))]
        await asyncio.sleep(0.5)
        print("sent", flush=True)
        await asyncio.gather(*tasks)

asyncio.run(victim())
"""


def _call(model: str, content: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
        "tools": TOOLS,
        "max_tokens": 16,
    }


async def fill(base: str, keys: list[str], sessions: int, concurrency: int) -> float:
    """``sessions`` live sessions over the bulk tenants' ``keys``: even ones named, odd ones
    implicit (their first message is their own); one call each. Returns the seconds it took."""
    started = time.perf_counter()
    todo = iter(range(sessions))
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:

        async def worker() -> None:
            for i in todo:
                headers = {"Authorization": f"Bearer {keys[i % len(keys)]}"}
                if i % 2 == 0:
                    headers["X-Talaria-Session-Id"] = f"bulk-{i}"
                body = _call(PROBE, f"bulk task {i}: make tests/test_{i}.py pass")
                response = await client.post("/v1/chat/completions", json=body, headers=headers)
                if response.status_code != 200:
                    raise RuntimeError(f"fill call {i}: {response.status_code} {response.text}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started


def instances(base: str) -> Any:
    """The admin API's view of the instances (running and waiting calls per model)."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    return httpx.get(base + "/admin/instances", headers=headers, timeout=30).json()


def py_spy_dump(pid: int) -> str:
    """The server's stacks now (``py-spy dump``), or why there are none."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        done = subprocess.run(
            [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"py-spy failed: {exc!r}"
    return done.stdout + done.stderr


def probe(
    served: ServeProcess, key: str, tag: str, timeout_s: float, stall_s: float, profile: bool
) -> dict[str, Any]:
    """One new implicit call of the probe tenant, timed; a stall's node state and stacks."""
    headers = {"Authorization": f"Bearer {key}"}
    body = _call(PROBE, f"probe {tag}: a new task")
    seen: dict[str, Any] = {}

    async def watch() -> None:
        await asyncio.sleep(stall_s)
        seen["instances"] = await asyncio.to_thread(instances, served.base_url)
        if profile:
            seen["stack"] = await asyncio.to_thread(py_spy_dump, served.process.pid)

    async def run() -> tuple[float, int]:
        watcher = asyncio.create_task(watch())
        started = time.perf_counter()
        try:
            async with httpx.AsyncClient(base_url=served.base_url, timeout=timeout_s) as client:
                response = await client.post("/v1/chat/completions", json=body, headers=headers)
            return time.perf_counter() - started, response.status_code
        except httpx.TimeoutException:
            return time.perf_counter() - started, 0
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    wall_s, status = asyncio.run(run())
    return {"probe": tag, "wall_s": round(wall_s, 2), "status": status, **seen}


def kill_round(
    served: ServeProcess, key: str, calls: int, hold_s: float, tag: str, warm: bool
) -> Any:
    """A victim client with ``calls`` calls in flight, SIGKILLed ``hold_s`` after it sent them
    (``warm``: each in a named session that had a short call first); the node's state just
    before the kill."""
    flags = [HOLDER, str(calls), str(262_144 - 64), tag, "1" if warm else "0"]
    command = [sys.executable, "-c", VICTIM, served.base_url, key, *flags]
    victim = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert victim.stdout is not None
    victim.stdout.readline()  # "sent"
    time.sleep(hold_s)
    before = instances(served.base_url)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    return before


def node_line(view: Any) -> str:
    """Running calls, and per model its residency and waiting calls (``/admin/instances``)."""
    node = view["data"][0]
    models = "; ".join(
        f"{m}: {r['state']}, {r['waiting_calls']} waiting" for m, r in node["residency"].items()
    )
    return f"{node['running_calls']} running; {models}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=0, help="bulk live sessions first")
    parser.add_argument("--tenants", type=int, default=2, help="bulk tenants")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--time-scale", type=float, default=1000.0)
    parser.add_argument("--idle-timeout-s", type=float, default=30.0)
    parser.add_argument("--victim-calls", type=int, default=12)
    parser.add_argument("--hold-s", type=float, default=1.0)
    parser.add_argument(
        "--warm", action="store_true", help="victim calls in named sessions with a call before"
    )
    parser.add_argument("--probes", type=int, default=2, help="probe calls after each kill")
    parser.add_argument("--probe-timeout-s", type=float, default=None, help="2 × idle + 30")
    parser.add_argument("--stall-s", type=float, default=5.0)
    parser.add_argument("--profile", action="store_true", help="py-spy dump during a stall")
    parser.add_argument("--log", type=Path, default=Path("out/abandoned-stall.log"))
    parser.add_argument("--json", type=Path, default=Path("out/abandoned-stall.json"))
    args = parser.parse_args()
    timeout_s = args.probe_timeout_s or 2 * args.idle_timeout_s + 30

    folder = Path(tempfile.mkdtemp(prefix="talaria-stall-"))
    url = f"sqlite+aiosqlite:///{folder / 'stall.db'}"
    bulk = [tenant_key(url, f"bulk-{i}") for i in range(args.tenants)]
    victim_key = tenant_key(url, "victim")
    probe_key = tenant_key(url, "probe")
    env = {
        "TALARIA_SESSION_IDLE_TIMEOUT_S": str(args.idle_timeout_s),
        "TALARIA_ADMIN_TOKEN": ADMIN_TOKEN,
    }
    serve_args = [
        "--models", f"{PROBE},{HOLDER}", "--time-scale", str(args.time_scale),
        "--database-url", url,
    ]  # fmt: skip
    doc: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "rounds": []}
    with talaria_serve(serve_args, env, folder) as served:
        if args.sessions:
            took = asyncio.run(fill(served.base_url, bulk, args.sessions, args.concurrency))
            doc["fill_s"] = round(took, 1)
            print(f"{args.sessions} bulk sessions in {took:.1f} s", flush=True)
        print("| round | node before the kill | probe | wall s | status | node at the stall |")
        print("|---|---|---|---|---|---|")
        for r in range(args.rounds):
            before = kill_round(
                served, victim_key, args.victim_calls, args.hold_s, str(r), args.warm
            )
            entry: dict[str, Any] = {"round": r, "before_kill": before, "probes": []}
            for p in range(args.probes):
                seen = probe(served, probe_key, f"{r}.{p}", timeout_s, args.stall_s, args.profile)
                entry["probes"].append(seen)
                stall = node_line(seen["instances"]) if "instances" in seen else ""
                print(
                    f"| {r} | {node_line(before)} | {p} | {seen['wall_s']} | {seen['status']} "
                    f"| {stall} |",
                    flush=True,
                )
            doc["rounds"].append(entry)
        args.log.parent.mkdir(parents=True, exist_ok=True)
        args.log.write_text("".join(served.output))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
