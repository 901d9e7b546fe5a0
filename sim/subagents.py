"""Sub-agents in a trace: which sessions a session spawns, and a seeded generator of them.

**Spawns** (``spawn_table``): a child session names its parent (``parent_session_id``) and the
parent's call after whose answer it starts (``parent_call_index``, docs/trace-format.md). The
replay (sim/replay.py) runs a spawned child inside its parent's agent: when that call's answer
is back the child starts, and the parent's next call is sent once the child has ended *and*
the call's own tool gap has passed (a Task tool: the parent waits for its sub-agent). A child
whose parent is not in the trace, or that gives no call index, starts at its own
``arrival_offset_s`` like any session.

**Generator** (``add_subagents``; every draw from ``random.Random(seed + SUBAGENT_SEED)``, so
the parents are the same with and without children):
each session of at least two calls spawns one child with probability ``fraction``, after its
call ``⌊u · (n − 1)⌋`` (never the last). The child runs the parent's model (Claude Code's
general-purpose sub-agent inherits it: an assumption for every agent), shares the first
``round(prefix_share · C0)`` tokens of the parent's call-0 prompt (its system prompt and tools;
the rest of C0 is the parent's task), adds its own task (one appended-tokens draw, the parent's
tool-call arguments), and runs ``clamp(round(lognormal(calls_median, calls_sigma)), 1,
calls_max)`` calls drawn as any session's (sim/workload.py ``draw_session_calls``). The
defaults are assumptions, not sourced: sub-agents are short (median 8 calls), and a system
prompt with tools is three quarters of a SWE-agent style C0 (docs/sources.md §2); bench/
subagents.py sweeps ``prefix_share``.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from talaria.core.trace import SessionTrace, TraceError
from talaria.sim.workload import WorkloadSpec, draw_appended_tokens, draw_session_calls

SUBAGENT_SEED = 0x5EED_5A
"""Added to the workload's seed for the sub-agents' own generator."""


@dataclass(frozen=True)
class SubagentSpec:
    """How many sessions spawn a sub-agent, how long it runs, and how much prompt it shares
    (module docstring; assumptions)."""

    fraction: float = 1 / 3
    calls_median: float = 8.0
    calls_sigma: float = 0.5
    prefix_share: float = 0.75

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0 or not 0.0 <= self.prefix_share <= 1.0:
            raise ValueError("fraction and prefix_share must be in [0, 1]")
        if self.calls_median <= 0 or self.calls_sigma < 0:
            raise ValueError("calls_median must be > 0 and calls_sigma >= 0")


Spawns = dict[tuple[str, int], list[SessionTrace]]
"""(parent id, call index) → the children that start after that call's answer."""


def spawn_table(sessions: Sequence[SessionTrace]) -> Spawns:
    """The spawned children of ``sessions`` by parent and call (module docstring).
    ``TraceError`` for a call index past the parent's calls or a loop of spawns (no session
    of it could ever start)."""
    by_id = {s.session_id: s for s in sessions}
    table: Spawns = {}
    parent_of: dict[str, str] = {}
    for session in sessions:
        first = session.calls[0]
        parent = by_id.get(first.parent_session_id or "")
        if first.parent_call_index is None or parent is None:
            continue
        if first.parent_call_index >= parent.num_calls:
            raise TraceError(
                f"session {session.session_id!r}: parent_call_index {first.parent_call_index} "
                f"but its parent {parent.session_id!r} has {parent.num_calls} calls"
            )
        table.setdefault((parent.session_id, first.parent_call_index), []).append(session)
        parent_of[session.session_id] = parent.session_id
    for child in parent_of:
        seen, at = {child}, child
        while at in parent_of:
            at = parent_of[at]
            if at in seen:
                raise TraceError(f"session {child!r}: its parents spawn each other in a loop")
            seen.add(at)
    return table


def add_subagents(
    sessions: Sequence[SessionTrace],
    workload: WorkloadSpec,
    spec: SubagentSpec,
    context_windows: Mapping[str, int],
    reasoning: Mapping[str, bool],
    seed: int,
) -> list[SessionTrace]:
    """``sessions`` and the children they spawn (module docstring), each child ``<parent>.a0``
    right after its parent."""
    rng = random.Random(seed + SUBAGENT_SEED)
    out: list[SessionTrace] = []
    for parent in sessions:
        out.append(parent)
        spawns, u_at = rng.random() < spec.fraction, rng.random()
        z_calls, task = rng.normalvariate(0.0, 1.0), draw_appended_tokens(rng, workload)
        if not spawns or parent.num_calls < 2:
            continue
        at = math.floor(u_at * (parent.num_calls - 1))
        shared = round(spec.prefix_share * parent.calls[0].prompt_tokens)
        n = round(spec.calls_median * math.exp(spec.calls_sigma * z_calls))
        n = max(1, min(workload.calls_max, n))
        cid, model = f"{parent.session_id}.a0", parent.model
        head = (cid, model, parent.start_s, n, max(1, shared + task))
        calls = draw_session_calls(
            rng, workload, head, context_windows[model], reasoning.get(model, False)
        )
        shared = min(shared, calls[0].prompt_tokens)
        calls = tuple(
            dataclasses.replace(
                c,
                parent_session_id=parent.session_id,
                parent_call_index=at if c.call_index == 0 else None,
                parent_prefix_tokens=shared if c.call_index == 0 else None,
                tenant=parent.tenant,
                priority=parent.priority,
                agent=parent.agent,
            )
            for c in calls
        )
        out.append(
            SessionTrace(
                cid, model, parent.start_s, calls, parent.tenant, parent.priority, parent.agent
            )
        )
    return out
