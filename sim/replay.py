"""Virtual-time replay: agent sessions as coroutines against the real node scheduler.

Each agent waits for its session's start, then sends its calls closed-loop: call, wait for the
answer, wait the recorded tool gap, call again. Agents send no gap hints (the scheduler learns
each session's gaps, as it would live without the SDK's explicit hints). Nodes are the real
``NodeScheduler`` over ``SimEngine`` engines, on a ``VirtualTimeLoop``.

Layouts: ``shared`` puts every model on ``nodes`` nodes (sessions spread over them by a seeded
hash of the session id — a placeholder for the proxy's router in a later issue); ``dedicated``
gives each model a node of its own that never switches.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from talaria.core.catalog import Catalog
from talaria.core.clock import LoopClock, run_virtual
from talaria.core.types import CallRequest, CallResult
from talaria.runtime.costmodel import CostModel
from talaria.runtime.engine import Engine
from talaria.runtime.engines.sim import SimEngine
from talaria.runtime.scheduling.flags import SchedulerFlags
from talaria.runtime.scheduling.node import NodeScheduler, SchedulerConfig, SlotRecord
from talaria.runtime.scheduling.resources import NodeMemory, PcieLink
from talaria.sim.trace import SessionTrace

HOST_RESERVE_FRACTION = 0.1
"""Host DRAM kept for the OS and the serving processes (est.); the rest, less the pinned weight
copies of every hosted model, is the host KV tier."""


@dataclass(frozen=True)
class NodeSetup:
    server: str
    profile: str
    models: tuple[str, ...]


@dataclass
class SessionOutcome:
    session_id: str
    model: str
    start_s: float
    end_s: float
    calls: list[CallResult]

    @property
    def sct_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class NodeOutcome:
    name: str
    models: tuple[str, ...]
    slots: list[SlotRecord]
    busy_s: float
    pcie_busy_s: float
    peak_hbm_bytes: float
    hbm_capacity_bytes: float
    peak_host_kv_bytes: float
    host_kv_capacity_bytes: float
    reservations: dict[str, int]


@dataclass
class ReplayOutcome:
    sessions: list[SessionOutcome]
    nodes: list[NodeOutcome] = field(default_factory=list)
    makespan_s: float = 0.0


def build_node(
    name: str,
    setup: NodeSetup,
    catalog: Catalog,
    flags: SchedulerFlags,
    config: SchedulerConfig,
    clock: LoopClock,
) -> NodeScheduler:
    server = catalog.server(setup.server)
    profile = catalog.profile(setup.profile)
    specs = [catalog.model(m) for m in setup.models]
    host_kv_capacity = server.host_dram_bytes * (1 - HOST_RESERVE_FRACTION) - sum(
        s.weight_bytes for s in specs
    )
    memory = NodeMemory(server.usable_hbm_bytes, host_kv_capacity)
    pcie = PcieLink(clock)
    engines: dict[str, Engine] = {
        spec.name: SimEngine(
            spec, CostModel(spec, server, profile), memory, pcie, clock, name, flags.host_kv
        )
        for spec in specs
    }
    return NodeScheduler(name, engines, memory, clock, flags, config, pcie)


def _request(session: SessionTrace, index: int) -> CallRequest:
    call = session.calls[index]
    return CallRequest(
        request_id=f"{session.session_id}/{index}",
        session_id=session.session_id,
        model=session.model,
        prompt_tokens=call.prompt_tokens,
        max_output_tokens=call.output_tokens,
        call_index=index,
        session_final=index == len(session.calls) - 1,
        shared_prefix_tokens=call.prompt_tokens - call.new_tokens,
    )


def replay(
    sessions: Sequence[SessionTrace],
    catalog: Catalog,
    layout: list[tuple[str, NodeSetup]],
    flags: SchedulerFlags,
    config: SchedulerConfig,
    on_call: Callable[[CallResult], None] | None = None,
) -> ReplayOutcome:
    """Replay ``sessions`` on the nodes of ``layout`` under ``flags``, in virtual time."""
    return run_virtual(_replay(sessions, catalog, layout, flags, config, on_call))


async def _replay(
    sessions: Sequence[SessionTrace],
    catalog: Catalog,
    layout: list[tuple[str, NodeSetup]],
    flags: SchedulerFlags,
    config: SchedulerConfig,
    on_call: Callable[[CallResult], None] | None,
) -> ReplayOutcome:
    import asyncio

    clock = LoopClock()
    nodes = [build_node(name, setup, catalog, flags, config, clock) for name, setup in layout]
    hosting: dict[str, list[NodeScheduler]] = {}
    for node in nodes:
        node.start()
        for model in node.engines:
            hosting.setdefault(model, []).append(node)

    async def agent(session: SessionTrace) -> SessionOutcome:
        candidates = hosting.get(session.model)
        if not candidates:
            raise ValueError(f"no node hosts model {session.model!r}")
        node = candidates[zlib.crc32(session.session_id.encode()) % len(candidates)]
        await clock.sleep(session.start_s - clock.now())
        start = clock.now()
        results: list[CallResult] = []
        for index, call in enumerate(session.calls):
            result = await node.submit(_request(session, index))
            results.append(result)
            if on_call is not None:
                on_call(result)
            if call.tool_gap_s is not None and index < len(session.calls) - 1:
                await clock.sleep(call.tool_gap_s)
        return SessionOutcome(session.session_id, session.model, start, clock.now(), results)

    outcomes = await asyncio.gather(*(agent(s) for s in sessions))
    makespan = clock.now()
    for node in nodes:
        await node.stop()
    return ReplayOutcome(list(outcomes), [_node_outcome(n) for n in nodes], makespan)


def _node_outcome(node: NodeScheduler) -> NodeOutcome:
    busy = sum(e.snapshot().busy_s for e in node.engines.values())
    return NodeOutcome(
        name=node.name,
        models=tuple(node.engines),
        slots=node.slots,
        busy_s=busy,
        pcie_busy_s=node.pcie.busy_s if node.pcie else 0.0,
        peak_hbm_bytes=node.memory.peak_hbm_bytes,
        hbm_capacity_bytes=node.memory.hbm_capacity_bytes,
        peak_host_kv_bytes=node.memory.peak_host_kv_bytes,
        host_kv_capacity_bytes=node.memory.host_kv_capacity_bytes,
        reservations={str(k): v for k, v in node.reservations.released.items()},
    )
