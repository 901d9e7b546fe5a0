"""Chaos under the real topology (issue 36, item 8): faults in sequence under a continuous
streaming load, then what the store kept.

The topology, all real processes on loopback: a throwaway PostgreSQL (scripts/pg.sh), two
``talaria runtime`` nodes (simulated engines, the clock ``time_scale`` times real time, a
``TALARIA_RUNTIME_TOKEN``), three ``talaria serve`` replicas on that database and both
runtimes (``TALARIA_REPLICA_AFFINITY=ingress``, the runtimes' token, an admin token, the same
``--time-scale``), and Debian's nginx with deploy/nginx/talaria.conf in front (only its
replica list and port filled in: bench/harness/nginx.py).

The load (bench/harness/agents.py): named sessions (their headers in turn:
``X-Talaria-Session-Id``, ``X-Claude-Code-Session-Id``, Codex's ``session-id``) and a few
implicit ones, each streaming on one API (chat completions, Messages, Responses), call after
call, a failed call resent unchanged.

The faults, one after the other, each once the load has recovered from the one before and
run steady for a while (every session ``settle_rounds`` acknowledged calls), each while a
call is streaming through what it hits:

1. ``kill -9`` of the replica that serves the most named sessions; nginx (``max_fails=1
   fail_timeout=5s``) sends its sessions to the others, which take them over from the store;
2. that replica restarted on its port (``restart_replica``), as Kubernetes restarts a pod:
   its sessions come back to it, taken over from the store again (what the test of a
   joining replica checks, here under load and right after a kill);
3. ``SIGSTOP`` of the runtime that holds the most sessions for ``stop_s`` (20 s), then
   ``SIGCONT``;
4. PostgreSQL stopped (fast shutdown) and started again on its port (``pg_down_s`` apart).

For each fault: the calls that failed (by API and kind), and how long the load took to
recover, measured from the fault (the kill), or from its end (the restarted replica
listening, ``SIGCONT``, PostgreSQL up): until every session has had an acknowledged call sent
after it (*every session served again*), and until the acknowledged calls over a 2 s window
reach 80 % of their rate before the fault (*rate back*). Then, from PostgreSQL: every
acknowledged call has its ``ok`` row (lost: 0), every named session has one session key (in
the replies' ``x-talaria-session-key`` and in the store), no session has two calls with one
``call_index``, and how many calls the store renumbered (proxy/store/call_numbers.py: two
replicas serving one session at once)."""

from __future__ import annotations

import asyncio
import bisect
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy import text

from bench.harness.agents import APIS, Agent, Attempt, Progress, drive, make_agents
from bench.harness.nginx import Nginx
from bench.harness.processes import (
    Postgres,
    ServeProcess,
    descendant_pids,
    free_port,
    talaria_runtime,
    talaria_serve,
)
from talaria.proxy.store.db import make_engine

MODEL = "glm-4.5-fp8"
ADMIN_TOKEN = "chaos-admin-token-0123456789"
RUNTIME_TOKEN = "chaos-runtime-token-0123456789abcdef"
CLUSTER_SECRET = "chaos-cluster-secret-0123456789abcdef"
NODE_TOML = """
[node]
name = "{name}"
policy = "talaria"
time_scale = {scale}

[[model]]
name = "{model}"
engine = "sim"
"""
RENUMBERED = "was taken (two replicas served it at once)"
"""What the store logs when it renumbers a call (proxy/store/call_numbers.py)."""
RATE_WINDOW_S = 2.0
RATE_SHARE = 0.8


@dataclass
class ChaosConfig:
    """The scenario's sizes and times (module docstring)."""

    sessions: int = 18
    """Named sessions (a header names each)."""
    implicit: int = 6
    """Sessions without a session header."""
    replicas: int = 3
    runtimes: int = 2
    time_scale: float = 50.0
    max_tokens: int = 16
    think_s: tuple[float, float] = (0.1, 0.4)
    stop_s: float = 20.0
    """How long the runtime stays stopped (SIGSTOP → SIGCONT)."""
    pg_down_s: float = 0.0
    """How long PostgreSQL stays down between its stop and its start."""
    restart_replica: bool = True
    recovery_bound_s: float = 60.0
    """The longest wait for a recovery; past it the scenario stops there."""
    settle_rounds: int = 8
    """Steady load after each recovery, before the next fault: every session has had this
    many acknowledged calls."""
    seed: int = 0
    replica_env: dict[str, str] = field(default_factory=dict)
    """More settings for every replica."""


@dataclass
class Fault:
    """One fault: when it began and ended (monotonic), and how the load recovered from its
    end (None: not within the bound)."""

    name: str
    started_at: float
    ended_at: float
    steady_since: float
    """When the steady load before it began (its pre-fault rate is measured from there)."""
    every_session_s: float | None = None
    rate_back_s: float | None = None
    pre_rate: float = 0.0
    acked_during: int = 0
    back_s: float | None = None
    """A restarted replica: from its start to its first call served again (nginx sends its
    sessions back once its ``fail_timeout`` is over)."""


@dataclass
class ChaosReport:
    """What a run saw and what the store kept."""

    config: ChaosConfig
    t0: float
    ended_at: float
    faults: list[Fault]
    attempts: list[Attempt]
    agents: list[Agent]
    lost: list[str] = field(default_factory=list)
    """Acknowledged calls without their ``ok`` row (request ids)."""
    not_stored: list[str] = field(default_factory=list)
    """Of those, the ones with no row at all."""
    split: dict[str, list[str]] = field(default_factory=dict)
    """Named sessions with more than one key (name → the keys seen or stored)."""
    repeated: list[tuple[str, int, int]] = field(default_factory=list)
    """(session key, call_index, times) of every index stored more than once."""
    renumbered: int = 0
    implicit_keys: dict[str, int] = field(default_factory=dict)
    """Implicit sessions: how many session keys each had (a new one when its owner died)."""
    logs: Path | None = None
    """Where the processes' logs were written."""

    @property
    def acked(self) -> list[Attempt]:
        """The acknowledged calls."""
        return [a for a in self.attempts if a.acked]

    @property
    def failed(self) -> list[Attempt]:
        """The calls that failed (and were resent)."""
        return [a for a in self.attempts if not a.acked]

    @property
    def unexpected(self) -> list[Attempt]:
        """Failures that are no fault's to make: a 4xx, or a 5xx without ``Retry-After``
        that nginx did not make (502/504 from a replica that died under it)."""
        out = []
        for a in self.failed:
            if a.outcome.startswith("http "):
                status = int(a.outcome[5:])
                if status < 500 or (a.retry_after is None and status not in (502, 504)):
                    out.append(a)
        return out

    def failure_lines(self) -> list[str]:
        """One line per failed call: when (s into the load), session, API, outcome, the
        replica nginx chose, the instance, the request id, what came back."""
        return [
            f"{a.sent_at - self.t0:7.2f} → {a.ended_at - self.t0:7.2f} s  {a.session} {a.api} "
            f"{a.outcome} via {a.upstream} on {a.instance} {a.request_id} "
            + " ".join(a.detail.split())[:200]
            for a in self.failed
        ]

    def phase_of(self, attempt: Attempt) -> str:
        """The fault a call belongs to: the last that began before the call ended."""
        name = "warm-up"
        for fault in self.faults:
            if fault.started_at <= attempt.ended_at:
                name = fault.name
        return name

    def table(self) -> str:
        """The run as Markdown tables: per phase, then the store's checks."""
        by_phase: dict[str, Counter[str]] = defaultdict(Counter)
        kinds: dict[str, Counter[str]] = defaultdict(Counter)
        longest: dict[str, float] = defaultdict(float)
        for a in self.attempts:
            phase = self.phase_of(a)
            if a.acked:
                longest[phase] = max(longest[phase], a.ended_at - a.sent_at)
            else:
                by_phase[phase][a.api] += 1
                kinds[phase][a.outcome] += 1
        rows = [
            "| phase | at s | failed calls (chat / messages / responses) | failures by kind "
            "| acked calls/s: before → during the fault | longest acked call s "
            "| every session served again after s | rate back after s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        phases: list[tuple[str, float, Fault | None]] = [("warm-up", 0.0, None)]
        phases += [(f.name, f.started_at - self.t0, f) for f in self.faults]
        for name, at, fault in phases:
            failed = " / ".join(str(by_phase[name][api]) for api in APIS)
            kind = ", ".join(f"{k} {n}" for k, n in sorted(kinds[name].items())) or "-"
            served = _seconds(fault.every_session_s) if fault else "-"
            rate = _seconds(fault.rate_back_s) if fault else "-"
            during = "-"
            if fault is not None:
                span = fault.ended_at - fault.started_at
                now = f"{fault.acked_during / span:.1f}" if span >= 1.0 else "-"
                during = f"{fault.pre_rate:.1f} → {now}"
            rows.append(
                f"| {name} | {at:.1f} | {failed} | {kind} | {during} | {longest[name]:.2f} "
                f"| {served} | {rate} |"
            )
        split_implicit = sum(1 for n in self.implicit_keys.values() if n > 1)
        rows += [
            "",
            "| check | value |",
            "|---|---|",
            f"| calls sent | {len(self.attempts)} |",
            f"| acknowledged calls | {len(self.acked)} |",
            f"| acknowledged calls lost | {len(self.lost)} |",
            f"| named sessions split across instances | {len(self.split)} |",
            f"| repeated call indices | {len(self.repeated)} |",
            f"| calls renumbered by the store | {self.renumbered} |",
            *(
                f"| {f.name}: serves calls again after s | {_seconds(f.back_s)} |"
                for f in self.faults
                if "restarted" in f.name and "replica" in f.name
            ),
            f"| implicit sessions that restarted as a new session | {split_implicit} "
            f"of {len(self.implicit_keys)} |",
            f"| unexpected failures (4xx, 500) | {len(self.unexpected)} |",
            f"| wall time of the scenario s | {self.ended_at - self.t0:.1f} |",
        ]
        return "\n".join(rows)


def _seconds(value: float | None) -> str:
    return "not recovered" if value is None else f"{value:.1f}"


class Cluster:
    """The processes (module docstring), started into ``stack``; PostgreSQL is the caller's."""

    def __init__(
        self, config: ChaosConfig, database_url: str, folder: Path, stack: ExitStack
    ) -> None:
        self.config, self.folder, self.stack = config, folder, stack
        self.runtimes: dict[str, ServeProcess] = {}
        for i in range(config.runtimes):
            name = f"node-{chr(ord('a') + i)}"
            toml = folder / f"{name}.toml"
            toml.write_text(NODE_TOML.format(name=name, scale=config.time_scale, model=MODEL))
            env = {"TALARIA_RUNTIME_TOKEN": RUNTIME_TOKEN}
            self.runtimes[name] = stack.enter_context(talaria_runtime(toml, env=env))
        self.args = ["--database-url", database_url, "--time-scale", str(config.time_scale)]
        for runtime in self.runtimes.values():
            self.args += ["--runtime", runtime.base_url]
        self.ports = [free_port() for _ in range(config.replicas)]
        self.replicas: list[ServeProcess] = []
        self.retired: list[ServeProcess] = []
        """Replicas killed (their logs are kept)."""
        for i in range(config.replicas):
            self.replicas.append(self._start(i))
        self.wait_for_peers()

    def _env(self, i: int) -> dict[str, str]:
        return {
            "TALARIA_REPLICA_URL": f"http://127.0.0.1:{self.ports[i]}",
            "TALARIA_REPLICA_AFFINITY": "ingress",
            "TALARIA_CLUSTER_SECRET": CLUSTER_SECRET,
            "TALARIA_ADMIN_TOKEN": ADMIN_TOKEN,
            "TALARIA_RUNTIME_TOKEN": RUNTIME_TOKEN,
            **self.config.replica_env,
        }

    def _start(self, i: int) -> ServeProcess:
        data = self.folder / f"replica{i}"
        data.mkdir(exist_ok=True)
        served = talaria_serve(self.args, self._env(i), data, port=self.ports[i])
        return self.stack.enter_context(served)

    @property
    def upstreams(self) -> list[str]:
        """The replicas as nginx lists them (``127.0.0.1:PORT``)."""
        return [f"127.0.0.1:{p}" for p in self.ports]

    def kill(self, i: int) -> None:
        """kill -9 replica ``i``."""
        self.replicas[i].kill9()
        self.retired.append(self.replicas[i])

    def restart(self, i: int) -> None:
        """Start replica ``i`` again on its port; returns once it listens."""
        self.replicas[i] = self._start(i)

    def wait_for_peers(self, timeout_s: float = 60.0) -> None:
        """Until every replica lists the others in its /readyz (bounded)."""
        deadline = time.monotonic() + timeout_s
        others = len(self.replicas) - 1
        while True:
            seen = []
            for replica in self.replicas:
                try:
                    checks = httpx.get(replica.base_url + "/readyz", timeout=5).json()["checks"]
                    seen.append(len(checks.get("replicas", {}).get("peers", ())))
                except (httpx.HTTPError, ValueError, KeyError):
                    seen.append(-1)
            if all(n == others for n in seen):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the replicas do not see each other: {seen}")
            time.sleep(0.1)  # polling a process's readiness (bounded by the deadline)

    def stop_runtime(self, name: str, sig: signal.Signals) -> None:
        """Send ``sig`` to runtime ``name`` and every process under it."""
        pid = self.runtimes[name].process.pid
        for each in [pid, *descendant_pids(pid)]:
            os.kill(each, sig)

    def write_logs(self, folder: Path, nginx: Nginx) -> None:
        """Every process's output, one file each."""
        folder.mkdir(exist_ok=True)
        for name, runtime in self.runtimes.items():
            (folder / f"runtime-{name}.log").write_text("".join(runtime.output))
        for n, replica in enumerate(self.retired):
            (folder / f"replica-killed-{n}.log").write_text("".join(replica.output))
        for i, replica in enumerate(self.replicas):
            (folder / f"replica-{i}.log").write_text("".join(replica.output))
        (folder / "nginx-error.log").write_text(nginx.error_log())

    def renumbered(self) -> int:
        """How many times the store renumbered a call, by the replicas' logs."""
        return sum(
            line.count(RENUMBERED) for r in [*self.replicas, *self.retired] for line in r.output
        )


class Watch:
    """The load's attempts as seen from the scenario's thread."""

    def __init__(self, progress: Progress, agents: list[Agent], bound_s: float) -> None:
        self.progress, self.bound_s = progress, bound_s
        self.names = {a.name for a in agents}
        self.named = {a.name for a in agents if a.header is not None}

    def every_session_after(self, since: float) -> float | None:
        """Wait until every session has had an acknowledged call sent at or after ``since``;
        the seconds from ``since`` to the last of those first calls' ends (None: not within
        the bound)."""
        first: dict[str, float] = {}
        scanned = [0]

        def everyone(attempts: list[Attempt]) -> bool:
            for a in attempts[scanned[0] :]:
                if a.acked and a.sent_at >= since and a.session not in first:
                    first[a.session] = a.ended_at
            scanned[0] = len(attempts)
            return first.keys() >= self.names

        if not self.progress.wait_for(everyone, self.bound_s):
            return None
        return max(first.values()) - since

    def rounds_after(self, since: float, rounds: int) -> bool:
        """Wait until every session has had ``rounds`` acknowledged calls sent at or after
        ``since`` (bounded)."""
        done: Counter[str] = Counter()
        scanned = [0]

        def enough(attempts: list[Attempt]) -> bool:
            for a in attempts[scanned[0] :]:
                if a.acked and a.sent_at >= since:
                    done[a.session] += 1
            scanned[0] = len(attempts)
            return all(done[name] >= rounds for name in self.names)

        return self.progress.wait_for(enough, self.bound_s)

    def first_acked(self, since: float, which: Callable[[Attempt], bool]) -> float | None:
        """Wait for an acknowledged call sent at or after ``since`` that ``which`` accepts;
        the seconds from ``since`` to its end (None: not within the bound)."""
        found: list[float] = []
        scanned = [0]

        def seen(attempts: list[Attempt]) -> bool:
            for a in attempts[scanned[0] :]:
                if a.acked and a.sent_at >= since and which(a):
                    found.append(a.ended_at)
            scanned[0] = len(attempts)
            return bool(found)

        if not self.progress.wait_for(seen, self.bound_s):
            return None
        return min(found) - since

    def streaming(self, where: Callable[[str | None, str | None], bool]) -> None:
        """Wait until a call is streaming whose (replica, instance) ``where`` accepts, so
        that the fault about to come cuts one (bounded: then it comes anyway)."""
        self.progress.wait_streaming(where, self.bound_s)


def busiest(
    watch: Watch, since: float, of: Callable[[Attempt], str | None], among: list[str]
) -> str:
    """Of ``among`` (replicas, instances), the one that ``of`` names for the most named
    sessions in the calls acknowledged since ``since``; ties to the first."""
    sessions: dict[str, set[str]] = defaultdict(set)
    for a in watch.progress.snapshot():
        where = of(a)
        if a.acked and a.ended_at >= since and where is not None and a.session in watch.named:
            sessions[where].add(a.session)
    return max(among, key=lambda w: len(sessions[w]))


def run_scenario(
    cluster: Cluster, pg: Postgres, watch: Watch, config: ChaosConfig, log: Callable[[str], None]
) -> list[Fault]:
    """The faults in sequence (module docstring); stops early when the load does not
    recover from one within the bound."""
    faults: list[Fault] = []
    if watch.every_session_after(0.0) is None:
        raise TimeoutError("the load did not start: not every session got an answer")
    steady = time.monotonic()
    watch.rounds_after(steady, config.settle_rounds)

    def recovered(fault: Fault) -> bool:
        faults.append(fault)
        fault.every_session_s = watch.every_session_after(fault.ended_at)
        log(f"{fault.name}: every session served again after {_seconds(fault.every_session_s)}")
        if fault.every_session_s is None:
            return False
        fault_over = fault.ended_at + fault.every_session_s
        watch.rounds_after(fault_over, config.settle_rounds)
        return True

    # 1. kill -9 the replica that serves the most named sessions
    upstream = busiest(watch, steady, lambda a: a.upstream, cluster.upstreams)
    victim = cluster.upstreams.index(upstream)
    watch.streaming(lambda replica, _: replica == upstream)
    at = time.monotonic()
    cluster.kill(victim)
    log(f"killed replica {upstream}")
    if not recovered(Fault(f"kill -9 replica {victim}", at, at, steady)):
        return faults

    # 2. ... and restart it on its port
    if config.restart_replica:
        steady = faults[-1].ended_at + (faults[-1].every_session_s or 0.0)
        at = time.monotonic()
        cluster.restart(victim)
        up = time.monotonic()
        log(f"replica {upstream} restarted in {up - at:.1f} s")
        if not recovered(Fault(f"replica {victim} restarted", at, up, steady)):
            return faults
        cluster.wait_for_peers()
        # nginx sends the sessions back once its fail_timeout is over: wait for that too,
        # so that the next fault meets three replicas serving
        faults[-1].back_s = watch.first_acked(up, lambda a: a.upstream == upstream)
        log(f"replica {victim} restarted: serves again after {_seconds(faults[-1].back_s)}")

    # 3. SIGSTOP the runtime that holds the most sessions, then SIGCONT
    steady = faults[-1].ended_at + (faults[-1].every_session_s or 0.0)
    runtime = busiest(watch, steady, lambda a: a.instance, list(cluster.runtimes))
    watch.streaming(lambda _, instance: instance == runtime)
    at = time.monotonic()
    cluster.stop_runtime(runtime, signal.SIGSTOP)
    log(f"stopped runtime {runtime} for {config.stop_s} s")
    try:
        time.sleep(config.stop_s)  # the fault itself: a runtime stopped this long
    finally:
        cluster.stop_runtime(runtime, signal.SIGCONT)
    cont = time.monotonic()
    if not recovered(Fault(f"runtime {runtime} stopped {config.stop_s:.0f} s", at, cont, steady)):
        return faults

    # 4. restart PostgreSQL on its port
    steady = faults[-1].ended_at + (faults[-1].every_session_s or 0.0)
    watch.streaming(lambda replica, _: True)
    at = time.monotonic()
    pg.stop()
    if config.pg_down_s > 0:
        time.sleep(config.pg_down_s)  # the fault itself: the database down this long
    pg.start()
    up = time.monotonic()
    log(f"PostgreSQL restarted in {up - at:.1f} s")
    recovered(Fault("PostgreSQL restarted", at, up, steady))
    return faults


def measure(faults: list[Fault], attempts: list[Attempt], end: float) -> None:
    """Each fault's pre-fault rate, its acknowledged calls while it lasted, and when the rate
    came back (``RATE_SHARE`` of it over a ``RATE_WINDOW_S`` window)."""
    ends = sorted(a.ended_at for a in attempts if a.acked)
    for i, fault in enumerate(faults):
        span = max(fault.started_at - fault.steady_since, 1e-9)
        fault.pre_rate = _count(ends, fault.steady_since, fault.started_at) / span
        fault.acked_during = _count(ends, fault.started_at, fault.ended_at)
        until = faults[i + 1].started_at if i + 1 < len(faults) else end
        want = RATE_SHARE * fault.pre_rate * RATE_WINDOW_S
        t = fault.ended_at
        while t + RATE_WINDOW_S <= until:
            if _count(ends, t, t + RATE_WINDOW_S) >= want:
                fault.rate_back_s = t + RATE_WINDOW_S - fault.ended_at
                break
            t += 0.1


def _count(sorted_times: list[float], start: float, end: float) -> int:
    return bisect.bisect_left(sorted_times, end) - bisect.bisect_left(sorted_times, start)


async def _store(url: str) -> tuple[list[tuple[str, str, int, str]], list[tuple[str, str, str]]]:
    """(request_id, session_key, call_index, status) of every call; (session_key, tenant_id,
    session_id) of every session."""
    engine = make_engine(url)
    try:
        async with engine.connect() as db:
            calls = await db.execute(
                text("SELECT request_id, session_key, call_index, status FROM calls")
            )
            sessions = await db.execute(
                text("SELECT session_key, tenant_id, session_id FROM sessions")
            )
            return (
                [(r[0], r[1], r[2], r[3]) for r in calls],
                [(r[0], r[1], r[2]) for r in sessions],
            )
    finally:
        await engine.dispose()


def check_store(report: ChaosReport, url: str) -> None:
    """Fill ``report``'s store checks (module docstring) from PostgreSQL at ``url``."""
    calls, sessions = asyncio.run(_store(url))
    status = {rid: st for rid, _, _, st in calls}
    acked = [a.request_id for a in report.acked if a.request_id is not None]
    report.lost = [rid for rid in acked if status.get(rid) != "ok"]
    report.not_stored = [rid for rid in report.lost if rid not in status]
    indices = Counter((key, index) for _, key, index, _ in calls)
    report.repeated = [(k, i, n) for (k, i), n in sorted(indices.items()) if n > 1]
    stored: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for key, tenant, client_id in sessions:
        stored[client_id].add((tenant, key))
    seen: dict[str, set[str]] = defaultdict(set)
    for a in report.attempts:
        if a.session_key is not None:
            seen[a.session].add(a.session_key)
    for agent in report.agents:
        if agent.header is None:
            report.implicit_keys[agent.name] = len(seen[agent.name])
            continue
        keys = seen[agent.name] | {key for _, key in stored[agent.name]}
        tenants = {tenant for tenant, _ in stored[agent.name]}
        if len(keys) != 1 or len(stored[agent.name]) != 1 or len(tenants) != 1:
            report.split[agent.name] = sorted(keys)


@contextmanager
def _postgres() -> Iterator[Postgres]:
    # in /tmp itself: the server runs as user postgres, who may not enter pytest's tmp_path
    pg = Postgres(Path(tempfile.mkdtemp(prefix="talaria-pg-")), free_port())
    try:
        pg.start()
        yield pg
    finally:
        try:
            pg.stop()
        finally:
            shutil.rmtree(pg.directory, ignore_errors=True)


def run_chaos(
    config: ChaosConfig, folder: Path, nginx_binary: str, log: Callable[[str], None] = print
) -> ChaosReport:
    """The whole run (module docstring) in ``folder`` (the processes' files and logs)."""
    tag = uuid.uuid4().hex[:6]
    agents = make_agents(config.sessions, config.implicit, MODEL, config.max_tokens, tag)
    progress, stop = Progress(), threading.Event()
    errors: list[BaseException] = []
    faults: list[Fault] = []
    with _postgres() as pg, ExitStack() as stack:
        started = time.monotonic()
        cluster = Cluster(config, pg.url, folder, stack)
        log(
            f"started {config.runtimes} runtimes, {config.replicas} replicas in "
            f"{time.monotonic() - started:.1f} s"
        )
        nginx = Nginx(nginx_binary, folder / "nginx")
        nginx.configure(cluster.upstreams)
        with nginx.running():

            def load() -> None:
                try:
                    asyncio.run(
                        drive(
                            nginx.url,
                            agents,
                            progress,
                            stop,
                            seed=config.seed,
                            think_s=config.think_s,
                        )
                    )
                except BaseException as exc:  # reported by the scenario's thread
                    errors.append(exc)

            loader = threading.Thread(target=load, name="chaos-load", daemon=True)
            t0 = time.monotonic()
            loader.start()
            watch = Watch(progress, agents, config.recovery_bound_s)
            try:
                faults = run_scenario(cluster, pg, watch, config, log)
            finally:
                stop.set()
                loader.join(timeout=180)
            ended = time.monotonic()
            if errors:
                raise errors[0]
            assert not loader.is_alive(), "the load did not stop"
        stack.close()  # the replicas drain and stop; PostgreSQL stays up for the checks
        cluster.write_logs(folder / "logs", nginx)
        attempts = progress.snapshot()
        report = ChaosReport(config, t0, ended, faults, attempts, agents, logs=folder / "logs")
        report.renumbered = cluster.renumbered()
        measure(faults, attempts, ended)
        check_store(report, pg.url)
    return report
