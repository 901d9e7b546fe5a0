"""The embedded runtime: simulated nodes in the proxy's own process (the default of
``talaria serve``), running the same scheduler as the simulator on a real or scaled clock."""

from __future__ import annotations

from talaria.core.catalog import Catalog
from talaria.core.clock import Clock
from talaria.proxy.runtime_client import InProcessRuntime
from talaria.proxy.settings import ProxySettings
from talaria.runtime.engines.sim_reply import ReplyPolicy
from talaria.runtime.factory import NodeSetup, build_sim_node
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import policy_flags


def build_embedded(
    settings: ProxySettings, catalog: Catalog, clock: Clock
) -> list[InProcessRuntime]:
    flags = policy_flags(settings.policy)
    config = SchedulerConfig(quantum_s=settings.quantum_s)
    setup = NodeSetup(settings.server, settings.profile, tuple(settings.models))
    replies = ReplyPolicy(tool_calls_before_answer=settings.sim_tool_calls)
    return [
        InProcessRuntime(
            build_sim_node(f"node{i}", setup, catalog, flags, config, clock, replies),
            clock,
            settings.status_ttl_s,
        )
        for i in range(settings.nodes)
    ]
