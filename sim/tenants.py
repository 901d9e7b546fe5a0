"""Workloads of several tenants (or agents): each load's sessions drawn from a workload of its
own (sim/workload.py), shifted to its start, tagged with its tenant, class and agent kind, and
merged.

Load ``k`` (in the order given) draws with seed ``seed + k · TENANT_SEED_STRIDE``, so adding
a load leaves the others' sessions as they were; its sessions are named ``<tenant>/s0000``,
``<tenant>/s0001``, ... (``<tenant>/<agent>/s0000`` for a load with an agent kind, so one
tenant may run several agents) and start ``start_s`` later than its workload alone would start
them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from talaria.core.trace import SessionTrace
from talaria.core.types import Priority
from talaria.sim.workload import WorkloadSpec, generate_sessions

TENANT_SEED_STRIDE = 1_000_003
"""Between tenants' seeds (a prime, so no tenant's seed is another's plus a small offset)."""


@dataclass(frozen=True)
class TenantLoad:
    """One tenant's load in a mixed workload: its sessions' workload, when they begin (seconds),
    their class, the tenant's share weight, and the kind of agent that runs them ("": none
    named)."""

    tenant: str
    workload: WorkloadSpec
    priority: Priority = Priority.STANDARD
    start_s: float = 0.0
    weight: float = 1.0
    agent: str = ""


def mixed_sessions(
    loads: Sequence[TenantLoad],
    context_windows: Mapping[str, int],
    reasoning: Mapping[str, bool],
    seed: int,
) -> list[SessionTrace]:
    """Every tenant's sessions (module docstring), ordered by start time, then id."""
    merged: list[SessionTrace] = []
    for k, load in enumerate(loads):
        drawn = generate_sessions(
            load.workload, context_windows, reasoning, seed + k * TENANT_SEED_STRIDE
        )
        for session in drawn:
            owner = f"{load.tenant}/{load.agent}" if load.agent else load.tenant
            sid = f"{owner}/{session.session_id}"
            start = round(session.start_s + load.start_s, 6)
            calls = tuple(
                replace(
                    c,
                    session_id=sid,
                    arrival_offset_s=start,
                    tenant=load.tenant,
                    priority=load.priority,
                    agent=load.agent,
                )
                for c in session.calls
            )
            merged.append(
                SessionTrace(
                    sid, session.model, start, calls, load.tenant, load.priority, load.agent
                )
            )
    return sorted(merged, key=lambda s: (s.start_s, s.session_id))


def union_workload(loads: Sequence[TenantLoad]) -> WorkloadSpec:
    """One spec standing for the mix where a preset needs one (its models, in first-seen
    order; its sessions and calls summed)."""
    models = tuple(dict.fromkeys(m for load in loads for m in load.workload.models))
    sessions = sum(load.workload.sessions for load in loads)
    calls = [load.workload.total_calls for load in loads]
    total = sum(c for c in calls if c is not None) if all(c is not None for c in calls) else None
    return replace(loads[0].workload, sessions=sessions, models=models, total_calls=total)
