"""Cluster benchmark: the cluster preset's sessions through R live proxy replicas, against one.

    .venv/bin/python bench/cluster_live.py                  # 120 sessions, R = 1 then 3, ~2.7 min
    .venv/bin/python bench/cluster_live.py --repeat 3 --json out/cluster-live.json
    .venv/bin/python bench/cluster_live.py --sessions 40 --replicas 2 --time-scale 10

Every part is a real process on loopback: a throwaway PostgreSQL (scripts/pg.sh), one
``talaria runtime`` per node of the ``cluster`` preset's layout (four nodes, three of the six
models each, simulated engines, the ``talaria`` scheduler, the preset's server, profile and
quantum, the clock ``--time-scale`` times real time), and R ``talaria serve`` replicas on that
database and those runtimes (``TALARIA_REPLICA_URL`` set, so R = 1 runs the same replica
machinery alone; ``--time-scale`` too, so that the proxy's clock, in which it learns tool gaps
and reads the runtimes' slot times, is the runtimes' simulated clock). The run waits until every
replica lists the others in ``/readyz``.

The preset's sessions for ``--seed`` (``talaria replay --preset cluster --seed S --sessions N``
replays the same ones) are then driven closed-loop, one agent per session, as
bench/fidelity/live.py's ``drive`` does, but posting the OpenAI chat bodies with aiohttp and
msgspec: with the ``openai`` client this driver took 42-52 s of CPU a run (11-14 ms a call,
this script's "driver CPU" column), most of a core of the two, and made the drive late; the
clients' own tests cover the SDKs. So: each session starts at its offset
and sleeps each tool gap, both divided by the time scale; each call appends a user message of
letters and spaces (4 bytes a token, the proxy's estimate) sized so that the conversation,
with the replies the engines gave, is the trace's prompt tokens (a trace call that truncates the
context starts it over), and asks for ``max_tokens`` = the trace's output tokens, with
``X-Talaria-Session-Id`` (and ``X-Talaria-Session-Final`` on the last call). The replies are
the simulated engine's text answers (no tools are offered), so the proxy takes no soft
reservations: sessions stay on their node by KV locality.

Call i of a session goes to replica i mod R, as a round-robin load balancer would send it: on
R > 1, (R-1)/R of the calls land on a replica that does not own the session and are forwarded
to its owner (``--balancer owner`` sends every call to its owner instead, a diagnostic;
``--balancer ingress`` sends every call of a session to the replica a consistent hash of its
session header picks, as nginx in front does, with the replicas in
``TALARIA_REPLICA_AFFINITY=ingress`` mode: nothing is forwarded).

Measured per run: each session's completion time (SCT: its first call sent to its last answer,
wall seconds × the time scale, so simulated seconds as ``talaria replay`` reports them), calls,
failures, forwarded calls (answers carrying ``x-talaria-replica``), and the CPU time (user + sys,
/proc/PID/stat) of every replica, runtime and PostgreSQL process and of this driver over the
drive. Proxy CPU per call = the replicas' CPU summed / calls sent.

R = 1 and R = ``--replicas`` run one after the other on the same sessions (``--repeat`` times,
alternated), each with fresh processes and a fresh database. The table compares them against
the scale-out targets (p50 SCT within 5 %, proxy CPU per call within 1.2× of one replica's:
issue 27), and the simulator's prediction for the same sessions (policy ``talaria``) is printed
alongside.
After each drive the store says where the calls' time went (the engines' slot wait, queue,
prefill and decode, in simulated seconds) and how their KV was found. The defaults (the whole
preset: 120 sessions, 3,840 calls; time ×20) take about 80 s a run, 2.7 min in all, on a
2-core machine. Every process is stopped and every temporary folder removed on exit, Ctrl-C
and SIGTERM included.

The parts: bench/cluster/ (deployment.py, measure.py, report.py) and the drive,
bench/harness/trace_drive.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/harness, bench/cluster

from bench.cluster.deployment import log, postmaster_pid, save_logs, show_errors, start
from bench.cluster.measure import CpuSnapshot, cpu_s, store_summary, summarize
from bench.cluster.report import CPU_TARGET, SCT_TARGET, commit, median_run, predict, ratios, table
from bench.harness.trace_drive import Words, drive
from talaria.core.catalog import Catalog, load_catalog
from talaria.core.trace import SessionTrace
from talaria.sim.experiment import ExperimentSetup
from talaria.sim.presets import get_preset
from talaria.sim.workload import generate_sessions

IDLE_S = 3.0


def workload(
    seed: int, sessions: int | None
) -> tuple[list[SessionTrace], ExperimentSetup, Catalog]:
    """The cluster preset's sessions (fewer with ``sessions``, calls scaled as ``talaria replay
    --sessions`` scales them) and its node layout."""
    preset = get_preset("cluster")
    spec = preset.workload
    if sessions is not None:
        total = round(spec.total_calls / spec.sessions * sessions) if spec.total_calls else None
        spec = replace(spec, sessions=sessions, total_calls=total)
    catalog = load_catalog([])
    models = [catalog.model(m) for m in spec.models]
    traces = generate_sessions(
        spec,
        {m.name: m.context_window_tokens for m in models},
        {m.name: m.reasoning for m in models},
        seed,
    )
    return traces, preset.experiment_setup(), catalog


def one_run(
    replicas: int,
    sessions: list[SessionTrace],
    words: Words,
    seed: int,
    setup: ExperimentSetup,
    scale: float,
    logs: Path | None = None,
    balancer: str = "round-robin",
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"talaria-cluster-r{replicas}-"))
    try:
        with ExitStack() as stack:
            affinity = "ingress" if balancer == "ingress" else "rendezvous"
            deployment = start(stack, work, setup, replicas, scale, affinity)
            replica_pids = [p.process.pid for p in deployment.replicas]
            runtime_pids = [p.process.pid for p in deployment.runtimes]
            master = postmaster_pid(deployment.pg_dir)
            calls = sum(s.num_calls for s in sessions)
            idle = [cpu_s(p) for p in replica_pids]
            time.sleep(IDLE_S)  # a measurement window: the replicas' CPU with no calls
            idle = [(cpu_s(p) - c) / IDLE_S for p, c in zip(replica_pids, idle, strict=True)]
            log(f"R={replicas}: idle replicas use {1000 * sum(idle):.1f} ms of CPU a second")
            log(f"R={replicas}: driving {len(sessions)} sessions, {calls} calls")
            before = CpuSnapshot.take(replica_pids, runtime_pids, master)
            wall0 = time.perf_counter()
            results = asyncio.run(
                drive(deployment.urls, sessions, words, seed, scale, balancer, log=log)
            )
            wall = time.perf_counter() - wall0
            after = CpuSnapshot.take(replica_pids, runtime_pids, master)
            log(f"R={replicas}: drive done in {wall:.1f} s; reading the store")
            stored = asyncio.run(store_summary(deployment.database_url, scale))
            log(f"R={replicas}: stopping the processes")
            if logs is not None:
                save_logs(logs / f"r{replicas}", deployment)
            if any(r.failures for r in results):
                show_errors(deployment)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = summarize(replicas, results, before, after, wall, scale)
    doc["idle_proxy_cpu_s_per_s"] = sum(idle)
    doc["store"] = stored
    # a call's time outside the engines (wall ms): the client's wait less the proxy's record
    # of it (the owner's arrival to its finish): the driver, HTTP, the forwarding hop, the
    # proxy's own work before and after the engine, and waiting for a CPU
    waited = sum(doc["call_time_s"].values()) / max(1, doc["calls"])
    doc["outside_engine_ms_per_call"] = 1000 * (waited - stored["mean_latency_s"]) / scale
    doc["idle_proxy_cpu_ms_per_call"] = 1000 * sum(idle) * wall / doc["calls"]
    return doc


def _unwind_on_signals() -> None:
    """SIGTERM unwinds like Ctrl-C, and Ctrl-C does even where the shell started this process
    with SIGINT ignored (a background job): every process is stopped and folder removed."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seed", type=int, default=0, help="Workload seed (default 0).")
    parser.add_argument(
        "--sessions",
        type=int,
        help="Drive this many sessions, calls scaled as `talaria replay --sessions` scales "
        "them (default: the preset's 120, 3,840 calls).",
    )
    parser.add_argument(
        "--replicas", type=int, default=3, help="Replicas compared with one (default 3)."
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=20.0,
        help="Simulated seconds per wall second, runtimes and proxies (default 20).",
    )
    parser.add_argument(
        "--predict",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Also replay the sessions in the simulator (policy talaria; default on).",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="Run R=1 and R=--replicas this many times, alternated; the ratios use the "
        "medians (default 1).",
    )
    parser.add_argument(
        "--balancer",
        choices=("round-robin", "owner", "ingress"),
        default="round-robin",
        help="round-robin (default): call i of a session to replica i mod R; owner: every "
        "call to its session's owner replica (a diagnostic: no call is forwarded, so the "
        "comparison shows what the replicas cost besides the forwarding hop); ingress: every "
        "call to the replica a consistent hash of its session header picks, the replicas in "
        "TALARIA_REPLICA_AFFINITY=ingress mode (what nginx in front does, "
        "deploy/nginx/talaria.conf).",
    )
    parser.add_argument("--json", type=Path, help="Write every figure and per-session SCT here.")
    parser.add_argument(
        "--logs", type=Path, help="Keep every replica's and runtime's log in this folder."
    )
    args = parser.parse_args()
    few = args.sessions is not None and args.sessions < 1
    if few or args.replicas < 2 or args.time_scale <= 0 or args.repeat < 1:
        parser.error("--sessions, --repeat >= 1, --replicas >= 2, --time-scale > 0 are needed")
    _unwind_on_signals()

    sessions, setup, catalog = workload(args.seed, args.sessions)
    words = Words(args.seed)
    calls = sum(s.num_calls for s in sessions)
    log(f"cluster preset, seed {args.seed}: {len(sessions)} sessions, {calls} calls")
    predicted = None
    if args.predict:
        log("replaying the same sessions in the simulator (policy talaria)")
        predicted = predict(sessions, catalog, setup)
    runs = []
    for replicas in [1, args.replicas] * args.repeat:  # alternated: drift hits both alike
        runs.append(
            one_run(
                replicas,
                sessions,
                words,
                args.seed,
                setup,
                args.time_scale,
                args.logs,
                args.balancer,
            )
        )
    pairs = [ratios(runs[i], runs[i + 1]) for i in range(0, len(runs), 2)]
    compared = ratios(median_run(runs[0::2]), median_run(runs[1::2]))

    print(
        f"cluster preset, seed {args.seed}, {len(sessions)} sessions, time ×{args.time_scale:g}, "
        f"{os.cpu_count()} cores, balancer {args.balancer}, commit {commit()}; "
        "SCT in simulated seconds"
    )
    print(table(runs, predicted))
    if args.repeat > 1:
        for i, pair in enumerate(pairs):
            print(
                f"pair {i + 1}: p50 SCT {pair['p50_sct_ratio']:.3f}, proxy CPU per call "
                f"{pair['proxy_cpu_per_call_ratio']:.2f}×"
            )
        print(f"medians over the {args.repeat} runs of each:")
    print(
        f"R={args.replicas} ÷ R=1: p50 SCT {compared['p50_sct_ratio']:.3f} "
        f"(target within ±{SCT_TARGET:.0%}: {'MET' if compared['p50_sct_met'] else 'MISSED'}), "
        f"p95 SCT {compared['p95_sct_ratio']:.3f}, per-session SCT ratio (median) "
        f"{compared['median_session_sct_ratio']:.3f}, p50 call time "
        f"{compared['p50_call_time_ratio']:.3f}, proxy CPU per call "
        f"{compared['proxy_cpu_per_call_ratio']:.2f}× (target ≤ {CPU_TARGET:g}×: "
        f"{'MET' if compared['proxy_cpu_met'] else 'MISSED'})"
    )
    for r in runs:
        st = r["store"]
        print(
            f"R={r['replicas']} store: {st['sessions']} sessions for {st['client_session_ids']} "
            f"client ids; per call (simulated s): latency {st['mean_latency_s']:.2f}, slot wait "
            f"{st['mean_slot_wait_s']:.2f}, queue {st['mean_queue_s']:.2f}, prefill "
            f"{st['mean_prefill_s']:.2f}, decode {st['mean_decode_s']:.2f}; KV "
            + ", ".join(f"{k} {v}" for k, v in sorted(st["calls_by_kv_source"].items()))
            + f"; output tokens {st['output_tokens']:,}; outside the engines "
            f"{r['outside_engine_ms_per_call']:.1f} ms (wall) a call; the driver's tool "
            f"sleeps woke {r['p50_sleep_overshoot_s']:.1f} s (simulated) late a session (median)"
        )
    busy_one, busy_many = compared["busy_proxy_cpu_ms_per_call"]
    print(
        f"proxy CPU per call less the idle replicas' share: {busy_one:.2f} ms (R=1), "
        f"{busy_many:.2f} ms (R={args.replicas}); {compared['forwarded_share']:.0%} of calls "
        f"forwarded, {compared['forwarding_cpu_ms_per_forwarded_call']:.2f} ms more per "
        "forwarded call"
    )
    if args.json is not None:
        doc = {
            "commit": commit(),
            "seed": args.seed,
            "time_scale": args.time_scale,
            "balancer": args.balancer,
            "layout": [[name, list(node.models)] for name, node in setup.layout()],
            "runs": runs,
            "ratios": compared,
            "pair_ratios": pairs,
            "predicted": predicted,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        log(f"wrote {args.json}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        log("interrupted: every process stopped, temporary folders removed")
        sys.exit(130)
