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
bench/fidelity/run.py's ``drive`` does, but posting the OpenAI chat bodies with aiohttp and
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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import secrets
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/harness

import aiohttp
import httpx
import msgspec
from sqlalchemy import text

from bench.harness.processes import (
    Postgres,
    ServeProcess,
    child_pids,
    free_port,
    talaria_runtime,
    talaria_serve,
)
from talaria.core.calls import MESSAGE_OVERHEAD_TOKENS, message_tokens
from talaria.core.catalog import Catalog, load_catalog
from talaria.core.http_edge import CLIENT_KEEP_ALIVE_S
from talaria.core.trace import SessionTrace
from talaria.proxy.cluster.owner import owner, route_key, weight
from talaria.proxy.store.db import make_engine
from talaria.sim.experiment import ExperimentSetup, run_experiment
from talaria.sim.metrics import percentile
from talaria.sim.presets import get_preset
from talaria.sim.workload import generate_sessions

ADMIN = "cluster-bench-admin"
READY_TIMEOUT_S = 60.0
IDLE_S = 3.0
SCT_TARGET = 0.05  # p50 SCT of R replicas within 5 % of one replica's
CPU_TARGET = 1.2  # proxy CPU per call within 1.2× of one replica's (issue 27; was 1.5×)
TICK_S = os.sysconf("SC_CLK_TCK")
LETTERS = string.ascii_lowercase + " " * 5  # words of ~5 letters on average


def log(message: str) -> None:
    print(f"[cluster-live {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- the workload --------------------------------------------------------------------------------


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


class Words:
    """Letters and spaces to cut user messages from: a seeded pool of 1 MiB, made before the
    drive; a cut is a slice (a copy), so the driver spends next to no CPU on text."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self._pool = "".join(rng.choices(LETTERS, k=1 << 20))

    def message(self, rng: random.Random, tokens: int) -> dict[str, str]:
        """A user message whose estimate by the proxy (4 bytes a token plus the message
        overhead, core/calls.py) is ``tokens``, at least 1 + the overhead."""
        n = 4 * max(1, tokens - MESSAGE_OVERHEAD_TOKENS)
        pool = self._pool * (n // len(self._pool) + 1) if n > len(self._pool) else self._pool
        start = rng.randrange(len(pool) - n + 1)
        return {"role": "user", "content": pool[start : start + n]}


# -- CPU accounting ------------------------------------------------------------------------------


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


def postmaster_pid(pg_dir: Path) -> int | None:
    try:
        return int((pg_dir / "data" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


# -- the deployment ------------------------------------------------------------------------------


def node_toml(name: str, models: tuple[str, ...], setup: ExperimentSetup, scale: float) -> str:
    blocks = "".join(f'\n[[model]]\nname = "{m}"\nengine = "sim"\n' for m in models)
    return (
        f'[node]\nname = "{name}"\npolicy = "talaria"\nquantum_s = {setup.quantum_s}\n'
        f'time_scale = {scale}\nserver = "{setup.server}"\nprofile = "{setup.profile}"\n{blocks}'
    )


@dataclass
class Deployment:
    replicas: list[ServeProcess]
    runtimes: list[ServeProcess]
    pg_dir: Path
    database_url: str
    urls: list[str] = field(default_factory=list)


def start(
    stack: ExitStack,
    work: Path,
    setup: ExperimentSetup,
    replicas: int,
    scale: float,
    affinity: str = "rendezvous",
) -> Deployment:
    """PostgreSQL, one runtime per node, ``replicas`` proxies (``TALARIA_REPLICA_AFFINITY``
    ``affinity``); every one stopped by ``stack``."""
    # a folder of its own: PostgreSQL runs as user postgres, who cannot enter ``work`` (0700)
    pg_dir = Path(tempfile.mkdtemp(prefix="talaria-cluster-pg-"))
    stack.callback(shutil.rmtree, pg_dir, ignore_errors=True)
    pg = Postgres(pg_dir, free_port())
    log(f"starting PostgreSQL in {pg_dir}")
    stack.callback(pg.stop)  # before start: a half-started server is stopped too
    try:
        url = pg.start()
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"PostgreSQL did not start: {exc.stderr}") from exc
    runtimes = []
    for name, node in setup.layout():
        config = work / f"{name}.toml"
        config.write_text(node_toml(name, node.models, setup, scale))
        log(f"starting runtime {name}: {', '.join(node.models)} (time ×{scale:g})")
        runtimes.append(stack.enter_context(talaria_runtime(config)))
    args = ["--database-url", url, "--time-scale", str(scale)]
    for runtime in runtimes:
        args += ["--runtime", runtime.base_url]
    proxies = []
    secret = secrets.token_urlsafe(32)  # the replicas sign their forwards with it
    for i in range(replicas):
        port = free_port()
        env = {
            "TALARIA_REPLICA_URL": f"http://127.0.0.1:{port}",
            "TALARIA_ADMIN_TOKEN": ADMIN,
            "TALARIA_CLUSTER_SECRET": secret,
            "TALARIA_REPLICA_AFFINITY": affinity,
        }
        data = work / f"replica{i}"
        data.mkdir()
        log(f"starting proxy replica {i + 1}/{replicas} on port {port}")
        proxies.append(stack.enter_context(talaria_serve(args, env, data, port=port)))
    deployment = Deployment(proxies, runtimes, pg_dir, url, [p.base_url for p in proxies])
    wait_ready(deployment)
    return deployment


def wait_ready(deployment: Deployment) -> None:
    """Until every replica is ready (store, runtimes) and lists all the others as peers."""
    others = len(deployment.urls) - 1
    deadline = time.monotonic() + READY_TIMEOUT_S
    seen: list[Any] = []
    with httpx.Client(timeout=10) as client:
        while time.monotonic() < deadline:
            seen = [client.get(u + "/readyz").json() for u in deployment.urls]
            if all(
                doc["ready"] and len(doc["checks"]["replicas"]["peers"]) == others for doc in seen
            ):
                log(f"{len(seen)} replica(s) ready, each listing its {others} peer(s)")
                return
            time.sleep(0.05)  # polling the replicas' own view, bounded by the deadline
    raise RuntimeError(f"replicas not ready within {READY_TIMEOUT_S:g} s: {seen}")


# -- the drive -----------------------------------------------------------------------------------


@dataclass
class SessionResult:
    session_id: str
    model: str
    calls: int = 0
    failures: list[str] = field(default_factory=list)
    forwarded: int = 0
    sct_wall_s: float = math.nan
    call_wall_s: float = 0.0
    """Wall seconds spent waiting for answers."""
    tool_s: float = 0.0
    """The trace's tool gaps this session slept (simulated seconds): SCT less the answers'
    wait less this is how late the driver's sleeps woke up."""


def ingress_index(urls: list[str], session_id: str) -> int:
    """The replica an ingress that hashes the session header sends ``session_id`` to
    (``--balancer ingress``): a consistent hash of the header's value over the replicas'
    positions, independent of the replicas' own owner choice, as nginx's would be."""
    return max(range(len(urls)), key=lambda i: weight(session_id, f"ingress-{i}"))


def owner_index(urls: list[str], session_id: str) -> int:
    """The replica that owns ``session_id`` (proxy/cluster/owner.py: replicas are named by
    their TALARIA_REPLICA_URL; the tenant of an open proxy is ``local``)."""
    key = route_key("local", session_id, None)
    assert key is not None  # an explicit session id always has one
    return urls.index(owner(key, urls))


async def drive(
    urls: list[str],
    sessions: list[SessionTrace],
    words: Words,
    seed: int,
    scale: float,
    balancer: str = "round-robin",
    ignore_eos: bool = False,
) -> list[SessionResult]:
    """One agent per session, closed loop; call i of a session goes to replica i mod R (with
    ``balancer`` "owner": always to the session's owner, so nothing is forwarded; "ingress":
    always to the replica a consistent hash of its session header picks).

    Each call's user message makes the conversation's estimated size the trace's prompt tokens
    (the replies the engines gave count as they are), so that the simulated engines see the
    trace's prompts; a trace call that truncates the context (new tokens = prompt tokens)
    starts the conversation over. ``ignore_eos``: each reply runs to the trace's output tokens
    (vLLM's extension), not to the simulated answer's own end."""
    http = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=600),
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=CLIENT_KEEP_ALIVE_S),
        headers={"authorization": "Bearer bench", "content-type": "application/json"},
    )
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    done = 0

    async def agent(session: SessionTrace) -> SessionResult:
        nonlocal done
        result = SessionResult(session.session_id, session.model)
        await asyncio.sleep(max(0.0, t0 + session.start_s / scale - loop.time()))
        started = loop.time()
        rng = random.Random(f"{seed}/{session.session_id}")
        home = (
            owner_index(urls, session.session_id)
            if balancer == "owner"
            else ingress_index(urls, session.session_id)
            if balancer == "ingress"
            else None
        )
        messages: list[Any] = []
        size = 0  # the proxy's estimate of ``messages``, in tokens
        last = len(session.calls) - 1
        for i, call in enumerate(session.calls):
            if i > 0 and call.new_tokens == call.prompt_tokens:
                messages, size = [], 0  # the trace truncated the context: history rewritten
            messages.append(words.message(rng, call.prompt_tokens - size))
            size += message_tokens(messages[-1])
            headers = {"X-Talaria-Session-Id": session.session_id}
            if i == last:
                headers["X-Talaria-Session-Final"] = "true"
            url = urls[i % len(urls) if home is None else home]
            body = {"model": session.model, "messages": messages, "max_tokens": call.output_tokens}
            if ignore_eos:
                body["ignore_eos"] = True
            sent = loop.time()
            result.calls += 1
            try:
                content, forwarded = await _chat(http, url, body, headers)
                result.forwarded += forwarded
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                result.failures.append(f"call {i} via {url}: {exc!r}"[:300])
                content = "(failed)"
            result.call_wall_s += loop.time() - sent
            messages.append({"role": "assistant", "content": content})
            size += message_tokens(messages[-1])
            if call.tool_gap_s is not None and i < last:
                await asyncio.sleep(call.tool_gap_s / scale)  # the tool runs
                result.tool_s += call.tool_gap_s
        result.sct_wall_s = loop.time() - started
        done += 1
        if done % max(1, len(sessions) // 10) == 0 or done == len(sessions):
            log(f"  {done}/{len(sessions)} sessions done")
        return result

    try:
        return list(await asyncio.gather(*(agent(s) for s in sessions)))
    finally:
        await http.close()


async def _chat(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[str, bool]:
    """POST a chat completion: (the reply's text, whether another replica answered it);
    ``ValueError`` for an answer that is not a 200 with a choice."""
    async with http.post(
        url + "/v1/chat/completions", data=msgspec.json.encode(body), headers=headers
    ) as answer:
        raw = await answer.read()
        if answer.status != 200:
            raise ValueError(f"HTTP {answer.status}: {raw[:200]!r}")
        reply = msgspec.json.decode(raw)
        content = reply["choices"][0]["message"].get("content") or ""
        return content, "x-talaria-replica" in answer.headers


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


def save_logs(folder: Path, deployment: Deployment) -> None:
    """Every process's log so far (stderr), one file each."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, proxy in enumerate(deployment.replicas):
        (folder / f"replica{i}.log").write_text("".join(proxy.output))
    for i, runtime in enumerate(deployment.runtimes):
        (folder / f"node{i}.log").write_text("".join(runtime.output))
    log(f"logs in {folder}")


def show_errors(deployment: Deployment, lines: int = 60) -> None:
    """The first error a replica logged (calls failed: what the proxy said)."""
    for i, proxy in enumerate(deployment.replicas):
        for n, line in enumerate(proxy.output):
            if "Traceback" in line or " ERROR" in line or line.startswith("ERROR"):
                log(f"replica {i}'s first error:\n" + "".join(proxy.output[n : n + lines]))
                return
    log("calls failed, but no replica logged an error")


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
            results = asyncio.run(drive(deployment.urls, sessions, words, seed, scale, balancer))
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


# -- report --------------------------------------------------------------------------------------


def table(runs: list[dict[str, Any]], predicted: dict[str, Any] | None) -> str:
    head = (
        "| replicas | sessions | calls | failures | forwarded | p50 SCT s | p95 SCT s "
        "| p50 call time s | wall s | proxy CPU ms/call | of which idle | runtimes CPU s "
        "| PG CPU s | driver CPU s | other CPU s | machine busy |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in runs:
        lines.append(
            f"| {r['replicas']} | {r['sessions']} | {r['calls']:,} | {r['failures']} "
            f"| {r['forwarded_calls']:,} | {r['p50_sct_s']:,.1f} | {r['p95_sct_s']:,.1f} "
            f"| {r['p50_call_time_s']:,.1f} | {r['wall_s']:.1f} "
            f"| {r['proxy_cpu_ms_per_call']:.2f} | {r['idle_proxy_cpu_ms_per_call']:.2f} "
            f"| {r['runtime_cpu_s']:.1f} "
            f"| {r['postgres_cpu_s']:.1f} | {r['driver_cpu_s']:.1f} "
            f"| {r['other_cpu_s']:.1f} | {r['machine_busy']:.0%} |"
        )
    if predicted is not None:
        lines.append(
            f"| simulator (talaria) | {predicted['sessions']} | {predicted['calls']:,} | | "
            f"| {predicted['p50_sct_s']:,.1f} | {predicted['p95_sct_s']:,.1f} | | | | | | | | | |"
        )
    return "\n".join(lines)


def ratios(one: dict[str, Any], many: dict[str, Any]) -> dict[str, Any]:
    sct = many["p50_sct_s"] / one["p50_sct_s"]
    cpu = many["proxy_cpu_ms_per_call"] / one["proxy_cpu_ms_per_call"]
    paired = [many["sct_s"][k] / v for k, v in one["sct_s"].items() if k in many["sct_s"]]
    # CPU per call less the idle replicas' share (heartbeats, sweeps), and what is left over
    # one replica's per forwarded call: the forwarding replica's work
    busy_one = one["proxy_cpu_ms_per_call"] - one["idle_proxy_cpu_ms_per_call"]
    busy_many = many["proxy_cpu_ms_per_call"] - many["idle_proxy_cpu_ms_per_call"]
    share = many["forwarded_calls"] / many["calls"]
    return {
        "p50_sct_ratio": sct,
        "p50_sct_met": abs(sct - 1) <= SCT_TARGET,
        "p95_sct_ratio": many["p95_sct_s"] / one["p95_sct_s"],
        "median_session_sct_ratio": percentile(paired, 50),
        "p50_call_time_ratio": many["p50_call_time_s"] / one["p50_call_time_s"],
        "proxy_cpu_per_call_ratio": cpu,
        "proxy_cpu_met": cpu <= CPU_TARGET,
        "busy_proxy_cpu_ms_per_call": [busy_one, busy_many],
        "forwarded_share": share,
        "forwarding_cpu_ms_per_forwarded_call": (busy_many - busy_one) / share
        if share
        else math.nan,
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over ``runs`` (one replica count) of every figure the ratios use."""
    if len(runs) == 1:
        return runs[0]
    keys = (
        "p50_sct_s",
        "p95_sct_s",
        "p50_call_time_s",
        "proxy_cpu_ms_per_call",
        "idle_proxy_cpu_ms_per_call",
        "forwarded_calls",
        "calls",
    )
    out: dict[str, Any] = {k: percentile([r[k] for r in runs], 50) for k in keys}
    out["sct_s"] = {
        k: percentile([r["sct_s"][k] for r in runs if k in r["sct_s"]], 50)
        for k in runs[0]["sct_s"]
    }
    return out


def predict(
    sessions: list[SessionTrace], catalog: Catalog, setup: ExperimentSetup
) -> dict[str, Any]:
    """The simulator's replay of the same sessions, policy talaria (about a second)."""
    doc = run_experiment(sessions, catalog, setup, ["talaria"], include_dedicated=False)
    talaria = doc["policies"]["talaria"]
    return {
        "sessions": doc["sessions"],
        "calls": doc["calls"],
        "p50_sct_s": talaria["p50_sct_s"],
        "p95_sct_s": talaria["p95_sct_s"],
        "mean_sct_s": talaria["mean_sct_s"],
    }


def commit() -> str:
    """The checkout's commit, with ``+dirty`` when tracked files differ from it."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "diff", "--quiet", "HEAD"], check=False
        ).returncode
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


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
