"""What the Talaria proxy itself costs per request, next to a direct server and LiteLLM's proxy.

    .venv/bin/python bench/proxy_overhead.py [--requests 800] [--concurrency 1,16,64] \\
        [--rounds 2] [--json out/proxy-overhead.json]

Four servers, each its own process on loopback, one worker each (bench/overhead/servers.py):

- ``direct``: a minimal server (Starlette + uvicorn) answering chat completions, Anthropic
  Messages and OpenAI Responses at once: 12 words, or an SSE stream with 12 text events;
- ``talaria``: the proxy (``create_app``) with an ``InstantRuntime`` (12 output tokens), session
  bookkeeping and persistence on, as ``talaria serve`` runs it: durable acknowledgement (each
  reply completes once its records are committed to SQLite, with group commit);
- ``talaria-async``: the same with ``durability=async`` (records written in the background);
- ``litellm``: LiteLLM's proxy (``litellm --config``) forwarding ``bench-model`` to ``direct``
  (chat completions only).

APIs (``--apis``, bench/overhead/apis.py): ``chat`` (``/v1/chat/completions``), ``messages``
(``/v1/messages``) and ``responses`` (``/v1/responses``, ``store: false`` as Codex sends it);
the targets apply to chat completions, the other two are reported next to the direct server.

Load: an asyncio HTTP/1.1 keep-alive client in this process, ``C`` connections for concurrency
``C``. Requests belong to ``requests / calls-per-session`` sessions (``X-Talaria-Session-Id``),
each several calls long with a growing history, the last one marked final. For each concurrency,
each round and each mode (non-streaming, streaming), the targets run one after another (their
order rotating), so drifts hit all alike. Per batch: every latency, the wall time, and the
server's own CPU time (utime + stime of its process tree from /proc, read after it settles), which
load does not distort. Every reply must succeed; any error aborts the run.

LiteLLM: ``--litellm PATH`` (default: the first of .venv/bin/litellm, out/litellm-venv/bin/litellm
and ``litellm`` on PATH that starts; a plain ``litellm`` without its ``[proxy]`` extra does not);
``LITELLM_LOCAL_MODEL_COST_MAP=True`` is set, and ``LITELLM_LOG=WARNING`` unless
``--access-log``. Without it the run reports talaria vs direct.

Results: docs/proxy-overhead.md. ``bench/overhead/writer_lag.py`` probes whether the proxy's
batched writer keeps up under sustained load. The parts: bench/overhead/ (procs.py: the
processes and their CPU time; litellm_proxy.py; measure.py: the batches; report.py: the rows,
the table and the targets).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from overhead.apis import APIS, sized_chat
from overhead.litellm_proxy import litellm_candidates, litellm_facts, start_litellm
from overhead.measure import (
    MODES,
    REPLY_TOKENS,
    TALARIA,
    Cell,
    Workload,
    idle_cpu,
    measure,
    serves,
    warm_up,
)
from overhead.procs import (
    ROOT,
    SERVERS,
    Server,
    free_port,
    gc_pauses,
    machine,
    proc_tree_cpu_s,
    start_server,
    stop_server,
    system_busy_s,
    wait_ready,
)
from overhead.profile import PySpy, summarize_profile
from overhead.report import print_profile, size_targets, summarize, table, targets


def _cpu_self_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Proxy overhead: talaria vs a direct server vs LiteLLM's proxy."
    )
    parser.add_argument("--requests", type=int, default=800, help="requests per batch")
    parser.add_argument("--concurrency", default="1,16,64", help="comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls-per-session", type=int, default=4)
    parser.add_argument("--modes", default="json,stream", help="json, stream or both")
    parser.add_argument(
        "--apis", default=",".join(APIS), help="comma-separated: " + ", ".join(APIS)
    )
    parser.add_argument(
        "--sizes",
        default="",
        help="comma-separated body sizes in KB (e.g. 2,32,128,400): chat completions shaped "
        "like an agent's (bench/overhead/apis.py agent_chat_body), one workload per size",
    )
    parser.add_argument(
        "--size-requests", type=int, default=200, help="requests per batch of a sized workload"
    )
    parser.add_argument("--warmup", type=int, default=200, help="warm-up requests per mode")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=0.2,
        help="least wait after a batch for the server "
        "to go idle before its CPU time is read (it waits on until it is idle)",
    )
    parser.add_argument("--idle-s", type=float, default=3.0, help="idle CPU measured this long")
    parser.add_argument("--litellm", help="the litellm executable (default: found)")
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument("--access-log", action="store_true", help="uvicorn access logs on")
    parser.add_argument(
        "--gc-log",
        action="store_true",
        help="the talaria servers log every garbage collection over 1 ms; the report gives "
        "their count and the longest, per generation",
    )
    parser.add_argument(
        "--no-freeze-gc",
        action="store_true",
        help="run talaria without gc.freeze() after start-up (the p99 stall it removes)",
    )
    parser.add_argument("--json", type=Path, default=ROOT / "out/proxy-overhead.json")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, db)")
    parser.add_argument(
        "--py-spy",
        metavar="PATH",
        help="profile the talaria server with this py-spy during the measurement "
        "(perturbs its figures a little: profile in a run of its own)",
    )
    parser.add_argument("--py-spy-rate", type=int, default=250, help="samples per second")
    args = parser.parse_args(argv)
    args.concurrency = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    args.modes = [m.strip() for m in str(args.modes).split(",") if m.strip()]
    if not args.concurrency or any(c < 1 for c in args.concurrency):
        parser.error("--concurrency: positive integers")
    if not set(args.modes) <= set(MODES) or not args.modes:
        parser.error("--modes: json and/or stream")
    args.apis = [a.strip() for a in str(args.apis).split(",") if a.strip()]
    args.sizes = [int(k) for k in str(args.sizes).split(",") if k.strip()]
    if not set(args.apis) <= set(APIS) or not (args.apis or args.sizes):
        parser.error("--apis: " + ", ".join(APIS) + " (or none, with --sizes)")
    if any(k < 1 for k in args.sizes):
        parser.error("--sizes: positive KB")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="talaria-overhead-"))
    servers: list[Server] = []
    started_servers: list[Server] = []
    notes: list[str] = []
    ok = False
    try:
        python = sys.executable
        log_flag = ["--access-log"] if args.access_log else []
        gc_flags = ["--gc-log"] if args.gc_log else []
        gc_flags += ["--no-freeze-gc"] if args.no_freeze_gc else []
        direct_port, talaria_port, async_port = free_port(), free_port(), free_port()
        direct = start_server(
            "direct",
            [python, str(SERVERS), "direct", "--port", str(direct_port), *log_flag],
            direct_port,
            workdir,
        )
        talaria = start_server(
            "talaria",
            [
                python,
                str(SERVERS),
                "talaria",
                "--port",
                str(talaria_port),
                "--db",
                str(workdir / "talaria.db"),
                "--output-tokens",
                str(REPLY_TOKENS),
                *log_flag,
                *gc_flags,
            ],
            talaria_port,
            workdir,
        )
        talaria_async = start_server(
            "talaria-async",
            [
                python,
                str(SERVERS),
                "talaria",
                "--port",
                str(async_port),
                "--db",
                str(workdir / "talaria-async.db"),
                "--output-tokens",
                str(REPLY_TOKENS),
                "--durability",
                "async",
                *log_flag,
                *gc_flags,
            ],
            async_port,
            workdir,
        )
        started_servers += [direct, talaria, talaria_async]
        wait_ready(direct, "/health", 60)
        wait_ready(talaria, "/healthz", 60)
        wait_ready(talaria_async, "/healthz", 60)
        servers = [direct, talaria, talaria_async]
        local = machine()
        for server in servers:
            server.info = {"loop": local["loop"], "http": local["http"]}

        candidates = [] if args.no_litellm else litellm_candidates(args.litellm)
        if not candidates and not args.no_litellm:
            notes.append("litellm not found: talaria vs direct only")
        for executable in candidates:
            lite = start_litellm(executable, direct_port, workdir, args.access_log)
            started_servers.append(lite)
            try:
                wait_ready(lite, "/health/liveliness", 180)
            except RuntimeError as exc:
                last = str(exc).strip().splitlines()[-1][:300]
                notes.append(f"{executable} did not start: {last}")
                stop_server(lite)
                continue
            lite.info = {"executable": executable, **litellm_facts(executable)}
            servers.append(lite)
            break
        for note in notes:
            print("NOTE:", note, file=sys.stderr)

        workloads = [Workload(args.requests, args.calls_per_session, APIS[a]) for a in args.apis]
        workloads += [
            Workload(args.size_requests, args.calls_per_session, sized_chat(kb))
            for kb in args.sizes
        ]

        async def run() -> dict[tuple[str, str, int, str], Cell]:
            for server in list(servers):
                try:
                    server.info["warmup"] = {
                        w.api.name: await warm_up(server, w, args.warmup, args.modes)
                        for w in workloads
                        if serves(server, w.api)
                    }
                except Exception as exc:
                    if server.name != "litellm":
                        raise
                    notes.append(f"litellm failed its warm-up: {exc}")
                    servers.remove(server)
                    stop_server(server)
            for server in servers:
                server.idle_cpu_per_s = await idle_cpu(server, args.idle_s)
                server.measured_from = server.log.stat().st_size
            if args.py_spy is None:
                return await measure(servers, workloads, args)
            spy = PySpy(args.py_spy, talaria.proc.pid, profile_path, args.py_spy_rate)
            try:
                return await measure(servers, workloads, args)
            finally:
                spy.stop()

        print(
            f"targets: {', '.join(s.name for s in servers)}; {args.requests} requests per batch "
            f"({workloads[0].sessions} sessions × {workloads[0].calls} calls), concurrency "
            f"{args.concurrency}, {args.rounds} round(s), modes {args.modes}, apis {args.apis}",
            flush=True,
        )
        profile_path = args.json.with_name(args.json.stem + "-talaria.collapsed")
        started = time.monotonic()
        busy0 = system_busy_s()
        ours0 = _cpu_self_s() + sum(proc_tree_cpu_s(s.proc.pid) for s in started_servers)
        cells = asyncio.run(run())
        elapsed = time.monotonic() - started
        ours = _cpu_self_s() + sum(proc_tree_cpu_s(s.proc.pid) for s in started_servers)
        other_load = max(0.0, (system_busy_s() - busy0) - (ours - ours0)) / elapsed
        rows = summarize(cells, servers, [w.api.name for w in workloads])
        profile = None
        if args.py_spy is not None:
            talaria_requests = sum(c.requests for k, c in cells.items() if k[3] == "talaria")
            profile = summarize_profile(profile_path, args.py_spy_rate, talaria_requests)
            profile["collapsed_stacks"] = str(profile_path)
        checks = targets(rows, args.concurrency) + size_targets(rows, args.sizes)
        report: dict[str, Any] = {
            "command": " ".join(["bench/proxy_overhead.py", *(argv or sys.argv[1:])]),
            "machine": local,
            "config": {
                "requests_per_batch": args.requests,
                "sessions_per_batch": workloads[0].sessions,
                "calls_per_session": workloads[0].calls,
                "apis": args.apis,
                "sizes_kb": args.sizes,
                "requests_per_sized_batch": args.size_requests,
                "concurrency": args.concurrency,
                "rounds": args.rounds,
                "modes": args.modes,
                "reply_tokens": REPLY_TOKENS,
                "access_log": args.access_log,
                "warmup_requests_per_mode": args.warmup,
                "settle_s": args.settle_s,
                "duration_s": round(elapsed, 1),
            },
            "other_load_cores": round(other_load, 3),
            "servers": {
                s.name: {**s.info, "idle_cpu_ms_per_s": s.idle_cpu_per_s * 1e3} for s in servers
            },
            "notes": notes,
            "results": rows,
            "targets": checks,
        }
        if profile is not None:
            report["profile_talaria"] = profile
        if args.gc_log:
            report["gc_pauses_over_1ms"] = {
                s.name: gc_pauses(s.log, s.measured_from) for s in servers if s.name in TALARIA
            }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print()
        print(table(rows))
        print()
        for s in servers:
            print(f"{s.name}: idle CPU {s.idle_cpu_per_s * 1e3:.2f} ms/s; {s.info.get('loop')}")
        for name, pauses in report.get("gc_pauses_over_1ms", {}).items():
            for generation, figures in pauses.items():
                print(
                    f"{name}: gc generation {generation}: {figures['count']} collections over "
                    f"1 ms, longest {figures['max_ms']:.1f} ms"
                )
        for c in checks:
            verdict = {True: "MET", False: "MISSED", None: "info"}[c["met"]]
            print(f"{verdict:>6}  {c['target']}: {c['measured']}")
        print(f"other processes on the machine meanwhile: {other_load:.2f} cores on average")
        for note in notes:
            print("NOTE:", note)
        if profile is not None:
            print_profile(profile)
        print(f"wrote {args.json}")
        ok = True
        return 0
    finally:
        for server in started_servers:
            stop_server(server)
        if ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"work dir (logs, db): {workdir}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
