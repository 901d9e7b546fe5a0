"""Build a node: its engines, memory, PCIe link and scheduler, from the catalog.

Used by the simulator's replay and by the proxy's embedded runtime, so both run the same node.
"""

from __future__ import annotations

from dataclasses import dataclass

from talaria.core.catalog import Catalog
from talaria.core.clock import Clock
from talaria.runtime.costmodel import CostModel
from talaria.runtime.engine import Engine
from talaria.runtime.engines.sim import SimEngine
from talaria.runtime.scheduling.flags import SchedulerFlags
from talaria.runtime.scheduling.node import NodeScheduler, SchedulerConfig
from talaria.runtime.scheduling.resources import NodeMemory, PcieLink

HOST_RESERVE_FRACTION = 0.1
"""Host DRAM kept for the OS and the serving processes (est.); the rest, less the pinned weight
copies of every hosted model, is the host KV tier."""


@dataclass(frozen=True)
class NodeSetup:
    server: str
    profile: str
    models: tuple[str, ...]


def build_sim_node(
    name: str,
    setup: NodeSetup,
    catalog: Catalog,
    flags: SchedulerFlags,
    config: SchedulerConfig,
    clock: Clock,
) -> NodeScheduler:
    """A node of ``SimEngine``s sharing one ``NodeMemory`` and one ``PcieLink``."""
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
