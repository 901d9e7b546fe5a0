"""The chaos scenario's faults in sequence (bench/harness/chaos/__init__.py), each once the load
has recovered from the one before and run steady, each while a call streams through what it
hits; ``Watch`` waits on the load's attempts from the scenario's thread."""

from __future__ import annotations

import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable

from bench.harness.agents import Agent, Attempt, Progress
from bench.harness.chaos.cluster import Cluster
from bench.harness.chaos.config import ChaosConfig
from bench.harness.chaos.report import Fault, seconds_text
from bench.harness.processes import Postgres


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
        log(f"{fault.name}: every session served again after {seconds_text(fault.every_session_s)}")
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
        log(f"replica {victim} restarted: serves again after {seconds_text(faults[-1].back_s)}")

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
