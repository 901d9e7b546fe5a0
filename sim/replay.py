"""Virtual-time replay: agent sessions as coroutines against the real node scheduler.

Each agent waits for its session's start, then sends its calls closed-loop: call, wait for the
answer, wait the recorded tool gap, call again. A sub-agent's session spawned by a call
(sim/subagents.py) starts at that call's answer instead, and its parent's next call also
waits for the child's end. Agents send no gap hints (the scheduler learns
each session's gaps, as it would live without the SDK's explicit hints). Nodes are the real
``NodeScheduler`` over ``SimEngine`` engines, on a ``VirtualTimeLoop``.

Every call goes through the replay's proxy (``sim/cluster.Dispatcher``): the policy's router
(``talaria.core.routing``) picks, per call, one of the nodes hosting the call's model from their
``status()`` snapshots. Layouts are lists of named nodes, each with its own model list: one
node hosting every model (the paper), several (the cluster, see ``sim/presets.py``), or one node
per model that never switches (``dedicated``), where the router has a single candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from talaria.core.catalog import Catalog
from talaria.core.clock import LoopClock, run_virtual
from talaria.core.efficiency_profile import EfficiencyProfile
from talaria.core.gap_model import GapQuality
from talaria.core.placement import PlacementConfig, PlacementTable
from talaria.core.routing import RoutingConfig
from talaria.core.trace import SessionTrace
from talaria.core.types import DEFAULT_TENANT, CallRequest, CallResult, Priority
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import SchedulerFlags
from talaria.runtime.scheduling.node import NodeScheduler
from talaria.runtime.scheduling.state import SlotRecord
from talaria.runtime.sim_node import NodeSetup, build_sim_node
from talaria.sim.cluster import Dispatcher
from talaria.sim.placement_driver import PlacementDriver
from talaria.sim.subagents import spawn_table


@dataclass
class SessionOutcome:
    """One replayed session: its trace's id and model, when its agent began and got its last
    answer back (virtual seconds), and its calls' results."""

    session_id: str
    model: str
    start_s: float
    end_s: float
    calls: list[CallResult]
    tenant: str = DEFAULT_TENANT
    priority: Priority = Priority.STANDARD
    parent_session_id: str | None = None
    """The parent of a sub-agent's session (its trace's), or None."""

    @property
    def sct_s(self) -> float:
        """Session completion time, seconds: end_s − start_s (transport included)."""
        return self.end_s - self.start_s


@dataclass
class NodeOutcome:
    """One node after a replay: its slots, busy times (s), peak memory use and capacities
    (bytes), and its holds released by reason and the memory they held (the document keeps
    the keys ``reservations`` and ``reservation_byte_s``)."""

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
    reservation_byte_s: float = 0.0
    """The admission budget its released holds kept, byte-seconds
    (``HoldTable.held_byte_s``)."""
    pinned_byte_s: float = 0.0
    """The KV its released holds kept pinned, byte-seconds (``pinned_byte_s``)."""
    gap_quality: dict[str, GapQuality] = field(default_factory=dict)
    """Per gap model the node kept: how well it predicted its sessions' gaps."""
    weight_loads: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per model, its weights' loads into HBM by the tier read from (core/weight_tiers.py;
    simulated engines count them)."""


@dataclass(frozen=True)
class Transport:
    """Time a call spends between the agent's proxy and the node, each way (a remote node's
    HTTP hop): the agent's call reaches the node ``forward_s`` after it is sent, and its answer
    is back ``return_s`` after the node finishes. SCT includes both; ``CallResult`` times stay
    the node's."""

    forward_s: float = 0.0
    return_s: float = 0.0

    @classmethod
    def of(cls, profile: EfficiencyProfile) -> Transport:
        """The transport ``profile`` measured (``transport_forward_s``, ``transport_return_s``)."""
        return cls(profile.transport_forward_s, profile.transport_return_s)


@dataclass
class ReplayOutcome:
    """What one replay produced: every session and node, the makespan (virtual seconds), and
    the routing's counts."""

    sessions: list[SessionOutcome]
    nodes: list[NodeOutcome] = field(default_factory=list)
    makespan_s: float = 0.0
    router: str = "talaria"
    routing_reasons: dict[str, int] = field(default_factory=dict)
    """Routing reason → calls (``talaria.core.routing``: only-candidate, reserved, kv-hbm...)."""
    migrations: int = 0
    """Continuation calls routed to a different node than the session's previous call."""
    transport: Transport = field(default_factory=Transport)
    placement: dict[str, Any] | None = None
    """The placement driver's summary (``PlacementDriver.summary``), if one ran."""


build_node = build_sim_node
"""The node the replay builds: ``runtime.sim_node.build_sim_node`` (the proxy's embedded runtime
builds the same)."""


def _request(session: SessionTrace, index: int, weights: Mapping[str, float]) -> CallRequest:
    call = session.calls[index]
    return CallRequest(
        parent_session_key=session.parent_session_id,
        parent_prefix_tokens=session.calls[0].parent_prefix_tokens or 0,
        tenant=session.tenant,
        tenant_weight=weights.get(session.tenant, 1.0),
        priority=session.priority,
        agent=session.agent,
        request_id=f"{session.session_id}/{index}",
        session_key=session.session_id,
        model=session.model,
        prompt_tokens=call.prompt_tokens,
        max_output_tokens=call.output_tokens,
        output_tokens=call.output_tokens,
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
    *,
    router: str = "talaria",
    routing: RoutingConfig | None = None,
    routing_seed: int = 0,
    transport: Transport | None = None,
    recorded_arrivals: bool = False,
    placement: PlacementConfig | None = None,
    tenant_weights: Mapping[str, float] | None = None,
) -> ReplayOutcome:
    """Replay ``sessions`` on the nodes of ``layout`` under ``flags``, in virtual time, each call
    routed by ``router`` (its tie-breaks drawn from ``random.Random(routing_seed)``) and
    carried each way by ``transport`` (default: none).

    ``recorded_arrivals``: each call is sent at its trace's ``arrival_offset_s`` (or as soon as
    the session's previous answer is back, if that is later) instead of one tool gap after the
    previous answer: the calls meet the node in the state they met live, so a call's predicted
    latency tests the node model alone, not the drift of the session before it.

    ``placement``: a placement controller moves models between the nodes by demand
    (sim/placement_driver.py), starting from ``layout``. ``tenant_weights``: each tenant's
    share weight (absent: 1), as its API key would give it live."""
    hop = transport or Transport()
    return run_virtual(
        _replay(
            sessions, catalog, layout, flags, config, on_call, router, routing, routing_seed, hop,
            recorded_arrivals, placement, tenant_weights or {},
        )
    )  # fmt: skip


async def _replay(
    sessions: Sequence[SessionTrace],
    catalog: Catalog,
    layout: list[tuple[str, NodeSetup]],
    flags: SchedulerFlags,
    config: SchedulerConfig,
    on_call: Callable[[CallResult], None] | None,
    router: str,
    routing: RoutingConfig | None,
    routing_seed: int,
    transport: Transport,
    recorded_arrivals: bool = False,
    placement: PlacementConfig | None = None,
    weights: Mapping[str, float] | None = None,
) -> ReplayOutcome:
    import asyncio

    clock = LoopClock()
    nodes = [build_node(name, setup, catalog, flags, config, clock) for name, setup in layout]
    hosted = {model for node in nodes for model in node.engines}
    for session in sessions:
        if session.model not in hosted and placement is None:
            raise ValueError(f"no node hosts model {session.model!r}")
    for node in nodes:
        node.start()
    driver = None
    table = None
    if placement is not None:
        table = PlacementTable({n.name: n.engines for n in nodes}, placement.drain_s)
        driver = PlacementDriver(
            {n.name: n for n in nodes},
            dict(layout),
            catalog,
            clock,
            placement,
            table,
            config.quantum_s,
        )
    proxy = Dispatcher(nodes, router, clock, routing, routing_seed, table, driver)
    if driver is not None:
        driver.live = proxy.live
        driver.start()

    spawns = spawn_table(sessions)
    spawned = {child.session_id for children in spawns.values() for child in children}
    outcomes: dict[str, SessionOutcome] = {}

    async def agent(session: SessionTrace) -> None:
        if session.session_id not in spawned:
            await clock.sleep(session.start_s - clock.now())
        start = clock.now()
        results: list[CallResult] = []
        for index, call in enumerate(session.calls):
            if recorded_arrivals and index > 0:
                await clock.sleep(call.arrival_offset_s - clock.now())
            if transport.forward_s > 0:
                await clock.sleep(transport.forward_s)
            result = await proxy.call(_request(session, index, weights or {}))
            if transport.return_s > 0:
                await clock.sleep(transport.return_s)
            results.append(result)
            if on_call is not None:
                on_call(result)
            last = index == len(session.calls) - 1
            gap = call.tool_gap_s is not None and not last and not recorded_arrivals
            children = spawns.get((session.session_id, index))
            if children:  # the tool gap and the sub-agents it runs, whichever ends last
                wait = clock.sleep(call.tool_gap_s or 0.0 if gap else 0.0)
                await asyncio.gather(wait, *(agent(child) for child in children))
            elif gap:
                await clock.sleep(call.tool_gap_s or 0.0)
        outcomes[session.session_id] = SessionOutcome(
            session.session_id, session.model, start, clock.now(), results, session.tenant,
            session.priority, session.parent_session_id,
        )  # fmt: skip

    agents = [asyncio.ensure_future(agent(s)) for s in sessions if s.session_id not in spawned]
    try:
        await asyncio.gather(*agents)
        makespan = clock.now()
    finally:  # after a failure, stop the other agents and the nodes before it propagates
        for task in agents:
            task.cancel()
        await asyncio.gather(*agents, return_exceptions=True)
        if driver is not None:
            await driver.stop()
        for node in nodes:
            await node.stop()
    return ReplayOutcome(
        [outcomes[s.session_id] for s in sessions],
        [_node_outcome(n) for n in nodes],
        makespan,
        router=proxy.router,
        routing_reasons=dict(sorted(proxy.reasons.items())),
        migrations=proxy.migrations,
        transport=transport,
        placement=driver.summary() if driver is not None else None,
    )


def _node_outcome(node: NodeScheduler) -> NodeOutcome:
    busy = sum(e.busy_s for e in node.engines.values())
    return NodeOutcome(
        name=node.name,
        models=tuple(node.engines),
        slots=list(node.slots),
        busy_s=busy,
        pcie_busy_s=node.pcie.busy_s if node.pcie else 0.0,
        peak_hbm_bytes=node.memory.peak_hbm_bytes,
        hbm_capacity_bytes=node.memory.hbm_capacity_bytes,
        peak_host_kv_bytes=node.memory.peak_host_kv_bytes,
        host_kv_capacity_bytes=node.memory.host_kv_capacity_bytes,
        # the replay document keeps its keys: ``reservations`` are the node's holds
        reservations={str(k): v for k, v in node.holds.released.items()},
        reservation_byte_s=node.holds.held_byte_s,
        pinned_byte_s=node.holds.pinned_byte_s,
        gap_quality=dict(node.gap_quality),
        weight_loads={m: dict(loads) for m, e in node.engines.items() if (loads := _loads(e))},
    )


def _loads(engine: object) -> dict[str, int]:
    loads: dict[str, int] = getattr(engine, "loads", {})
    return loads
