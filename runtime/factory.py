"""A node built from its config (``build_node_from_config``: ``BuiltNode``, each model's
engine built by the ``EngineKind`` runtime/engine_kinds.py registers under the config's
``engine`` name), and the models placed on it or removed while it runs (``place_model``,
``unplace_model``: the runtime's placement endpoints, runtime/placement_routes.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from talaria.core.catalog import Catalog
from talaria.core.clock import Clock
from talaria.runtime.config import ModelConfig, NodeConfig, NodeConfigError
from talaria.runtime.engine import Engine
from talaria.runtime.engine_kinds import EngineSite, engine_kind
from talaria.runtime.memory.resources import DeviceShare, NodeMemory, PcieLink
from talaria.runtime.memory.sizing import device_memory, node_memory
from talaria.runtime.scheduling.flags import policy_flags
from talaria.runtime.scheduling.node import NodeScheduler
from talaria.runtime.scheduling.policies.compose import PolicyChoice


@dataclass
class BuiltNode:
    """A node built from a config, with the engines that need starting and stopping."""

    node: NodeScheduler
    engines: dict[str, Engine]
    host_weight_bytes: dict[str, float] = field(default_factory=dict)
    """Per model: its pinned host weight copy, outside the host KV tier (0 or absent: an
    engine that keeps its own memory)."""


class EngineStartError(RuntimeError):
    """A model placed on a running node could not be built or started (``place_model``)."""


def build_node_from_config(config: NodeConfig, catalog: Catalog, clock: Clock) -> BuiltNode:
    """One node of the engines its config names, each built by its registered ``EngineKind``.

    The node's byte accounting (``NodeMemory``) binds only engines that keep their memory there
    (the simulated ones, sized from their catalog specs); a node of only self-managing engines
    (vLLM's, without ``MemoryAccounting``) gets its device's memory (``device_memory``)."""
    policy = PolicyChoice.of(policy_flags(config.policy))
    kinds = [(m, engine_kind(m.engine)) for m in config.models]
    bound = [m for m, kind in kinds if kind.uses_node_memory]
    memory = NodeMemory(float("inf"), 0.0)
    if bound:
        specs = [catalog.model(m.name) for m in bound]
        memory = node_memory(config.server_spec(catalog), specs)
    pcie = PcieLink(clock)
    device = DeviceShare()
    engines: dict[str, Engine] = {}
    for model, kind in kinds:
        site = EngineSite(config, model, catalog, clock, policy, memory, pcie, device)
        engines[model.name] = kind.build(site)
    if not bound:
        memory = device_memory(engines.values())
    scheduler = NodeScheduler(
        config.name, engines, memory, clock, policy, config.scheduler_config(),
        pcie, device,
    )  # fmt: skip
    host = {m.name: catalog.model(m.name).weight_bytes for m in bound}
    return BuiltNode(scheduler, engines, host)


async def place_model(
    built: BuiltNode, config: NodeConfig, model: ModelConfig, catalog: Catalog
) -> Engine:
    """Start an engine for ``model`` (a ``[[model]]`` entry) on a running node and host it
    (placement, the runtime's ``POST /v1/runtime/models``): built by its registered kind with
    the node's shared memory, link and GPUs, started (a simulated one: and loaded on the
    node's clock, ``EngineKind.loads_on_clock``), then added to the scheduler; an engine
    that keeps its memory in ``NodeMemory`` takes its pinned host weight copy out of the host
    KV tier. ``ValueError`` if the node hosts it already; ``NodeConfigError`` if the entry
    cannot be built (its model directory missing or unreadable: ``OSError``, or a bad option:
    ``ValueError``); ``EngineStartError`` if the engine fails otherwise, once what it started
    is shut down. Either way the node is unchanged."""
    node = built.node
    if model.name in node.engines:
        raise ValueError(f"node {node.name} already hosts {model.name!r}")
    kind = engine_kind(model.engine)
    load_s = 0.0
    if kind.loads_on_clock:
        weight_bytes = catalog.model(model.name).weight_bytes
        load_s = config.server_spec(catalog).placement_s(weight_bytes, from_peer=False)
    assert node.pcie is not None and node.device is not None, "a built node"
    site = EngineSite(
        config, model, catalog, node.clock, node.policy, node.memory, node.pcie, node.device
    )
    try:
        engine = kind.build(site)
    except (OSError, ValueError) as exc:
        raise NodeConfigError(f"model {model.name!r}: {exc}") from exc
    except Exception as exc:
        raise EngineStartError(f"model {model.name!r}: engine not built: {exc!r}") from exc
    try:
        await engine.start()
        await node.clock.sleep(load_s)
    except Exception as exc:
        with contextlib.suppress(Exception):
            await engine.shutdown()
        raise EngineStartError(f"model {model.name!r}: engine did not start: {exc!r}") from exc
    host_bytes = catalog.model(model.name).weight_bytes if kind.uses_node_memory else 0.0
    node.add_model(model.name, engine, host_bytes)
    built.engines[model.name] = engine
    built.host_weight_bytes[model.name] = host_bytes
    return engine


async def unplace_model(built: BuiltNode, name: str) -> None:
    """Stop hosting ``name`` (the runtime's ``DELETE /v1/runtime/models/{name}``): the
    scheduler retires it once its calls are done (``NodeScheduler.retire``), then its engine
    shuts down."""
    engine = built.engines[name]
    await built.node.retire(name, built.host_weight_bytes.get(name, 0.0))
    del built.engines[name]
    built.host_weight_bytes.pop(name, None)
    await engine.shutdown()
