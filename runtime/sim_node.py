"""A simulated node: its setup from the catalog (``NodeSetup``), its build (``build_sim_node``:
``SimEngine``s sharing one ``NodeMemory``, one ``PcieLink`` and the GPUs' time, under one
``NodeScheduler``), and a model added to it while it runs (``add_sim_model``, placement).

The simulator's replay and the proxy's embedded runtime both build their nodes here, so both
run the same node.
"""

from __future__ import annotations

from dataclasses import dataclass

from talaria.core.catalog import Catalog
from talaria.core.clock import Clock
from talaria.core.groups import group_server
from talaria.core.server_spec import ServerSpec
from talaria.runtime.costmodel import CostModel
from talaria.runtime.engine import Engine
from talaria.runtime.engines.sim import SimEngine
from talaria.runtime.engines.sim_reply import DEFAULT_REPLIES, ReplyPolicy
from talaria.runtime.memory.resources import DeviceShare, PcieLink
from talaria.runtime.memory.sizing import node_memory
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import SchedulerFlags
from talaria.runtime.scheduling.node import NodeScheduler
from talaria.runtime.scheduling.policies.compose import PolicyChoice


@dataclass(frozen=True)
class NodeSetup:
    """A simulated node: its server and efficiency profile (catalog names), the models it
    hosts, and its GPUs: a group of the server's (core/groups.py; None: all of them)."""

    server: str
    profile: str
    models: tuple[str, ...]
    gpus: int | None = None

    def server_spec(self, catalog: Catalog) -> ServerSpec:
        """The server, or the group of ``gpus`` of its GPUs."""
        server = catalog.server(self.server)
        return server if self.gpus is None else group_server(server, self.gpus)


def build_sim_node(
    name: str,
    setup: NodeSetup,
    catalog: Catalog,
    policy: PolicyChoice | SchedulerFlags,
    config: SchedulerConfig,
    clock: Clock,
    replies: ReplyPolicy = DEFAULT_REPLIES,
) -> NodeScheduler:
    """A node of ``SimEngine``s sharing one ``NodeMemory`` and one ``PcieLink``; ``replies``:
    what the engines answer live calls (runtime/engines/sim_reply.py); ``policy``: the node's
    choice of policies or a named policy's flags."""
    choice = policy if isinstance(policy, PolicyChoice) else PolicyChoice.of(policy)
    server = setup.server_spec(catalog)
    profile = catalog.profile(setup.profile)
    specs = [catalog.model(m) for m in setup.models]
    memory = node_memory(server, specs)
    pcie = PcieLink(clock)
    device = DeviceShare()
    engines: dict[str, Engine] = {
        spec.name: SimEngine(
            spec,
            CostModel(spec, server, profile),
            memory,
            pcie,
            clock,
            name,
            choice.kv_on_host,
            replies,
            device,
            class_eviction=choice.evicts_by_class,
        )
        for spec in specs
    }
    return NodeScheduler(name, engines, memory, clock, choice, config, pcie, device)


def add_sim_model(
    node: NodeScheduler,
    setup: NodeSetup,
    model: str,
    catalog: Catalog,
    replies: ReplyPolicy = DEFAULT_REPLIES,
) -> None:
    """Host ``model`` on a node ``build_sim_node`` built (placement): a ``SimEngine`` sharing
    the node's memory, link and GPUs, whose pinned host weight copy leaves the host KV tier."""
    assert node.pcie is not None and node.device is not None, "a build_sim_node node"
    spec = catalog.model(model)
    cost = CostModel(spec, setup.server_spec(catalog), catalog.profile(setup.profile))
    engine = SimEngine(
        spec, cost, node.memory, node.pcie, node.clock, node.name, node.policy.kv_on_host,
        replies, node.device, class_eviction=node.policy.evicts_by_class,
    )  # fmt: skip
    node.add_model(model, engine, spec.weight_bytes)
