"""What a chaos run saw: each fault and how the load recovered from it (``measure``: the
acknowledged rate before, during and after), the failed calls by phase, and the store's checks
(``check_store``: lost calls, split sessions, repeated call indices), as ``ChaosReport``."""

from __future__ import annotations

import asyncio
import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import text

from bench.harness.agents import APIS, Agent, Attempt
from bench.harness.chaos.config import ChaosConfig
from talaria.proxy.store.db import make_engine

RATE_WINDOW_S = 2.0

RATE_SHARE = 0.8


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
            served = seconds_text(fault.every_session_s) if fault else "-"
            rate = seconds_text(fault.rate_back_s) if fault else "-"
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
                f"| {f.name}: serves calls again after s | {seconds_text(f.back_s)} |"
                for f in self.faults
                if "restarted" in f.name and "replica" in f.name
            ),
            f"| implicit sessions that restarted as a new session | {split_implicit} "
            f"of {len(self.implicit_keys)} |",
            f"| unexpected failures (4xx, 500) | {len(self.unexpected)} |",
            f"| wall time of the scenario s | {self.ended_at - self.t0:.1f} |",
        ]
        return "\n".join(rows)


def seconds_text(value: float | None) -> str:
    return "not recovered" if value is None else f"{value:.1f}"


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
