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
replicas serving one session at once).

The parts: config.py (``ChaosConfig``), cluster.py (the processes), scenario.py (the faults in
sequence, watching the load), report.py (``Fault``, ``ChaosReport``, the rates and the store's
checks); ``run_chaos`` here runs them all."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from bench.harness.agents import Progress, drive, make_agents
from bench.harness.chaos.cluster import Cluster
from bench.harness.chaos.config import MODEL, ChaosConfig
from bench.harness.chaos.report import ChaosReport, Fault, check_store, measure
from bench.harness.chaos.scenario import Watch, run_scenario
from bench.harness.nginx import Nginx
from bench.harness.processes import Postgres, free_port

__all__ = ["ChaosConfig", "ChaosReport", "Fault", "run_chaos"]


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
