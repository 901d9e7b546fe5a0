"""Build a node: its engines, memory, PCIe link and scheduler, from the catalog.

Used by the simulator's replay and by the proxy's embedded runtime, so both run the same node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from talaria.core.catalog import Catalog, ModelSpec, ServerSpec
from talaria.core.clock import Clock
from talaria.runtime.config import ModelConfig, NodeConfig, NodeConfigError
from talaria.runtime.costmodel import CostModel
from talaria.runtime.engine import Engine
from talaria.runtime.engines.sim import SimEngine
from talaria.runtime.engines.sim_reply import DEFAULT_REPLIES, ReplyPolicy
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import SchedulerFlags, policy_flags
from talaria.runtime.scheduling.node import NodeScheduler
from talaria.runtime.scheduling.resources import DeviceShare, NodeMemory, PcieLink

HOST_RESERVE_FRACTION = 0.1
"""Host DRAM kept for the OS and the serving processes (est.); the rest, less the pinned weight
copies of every hosted model, is the host KV tier."""


def node_memory(server: ServerSpec, models: Sequence[ModelSpec]) -> NodeMemory:
    """HBM: the server's usable HBM. Host KV tier: host DRAM × (1 − reserve) − the pinned weight
    copies of every hosted model (so each can be woken)."""
    host_kv = server.host_dram_bytes * (1 - HOST_RESERVE_FRACTION) - sum(
        m.weight_bytes for m in models
    )
    return NodeMemory(server.usable_hbm_bytes, host_kv)


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
    replies: ReplyPolicy = DEFAULT_REPLIES,
) -> NodeScheduler:
    """A node of ``SimEngine``s sharing one ``NodeMemory`` and one ``PcieLink``; ``replies``:
    what the engines answer live calls (runtime/engines/sim_reply.py)."""
    server = catalog.server(setup.server)
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
            flags.host_kv,
            replies,
            device,
        )
        for spec in specs
    }
    return NodeScheduler(name, engines, memory, clock, flags, config, pcie)


@dataclass
class BuiltNode:
    """A node built from a config, with the engines that need starting and stopping."""

    node: NodeScheduler
    engines: dict[str, Engine]


def _calibrated_cost(config: NodeConfig, catalog: Catalog, model: str) -> CostModel | None:
    """The cost model of a vLLM-served ``model`` if the node's profile has a ``StepFit`` for it
    (and the catalog knows the model), else None (the engine's rate defaults apply)."""
    profile = catalog.profile(config.profile)
    if model not in profile.fitted or model not in catalog.models:
        return None
    return CostModel(catalog.model(model), catalog.server(config.server), profile)


def _serving_defaults(config: NodeConfig, catalog: Catalog, model: ModelConfig) -> dict[str, Any]:
    """The catalog's tool-call and reasoning parsers and chat template for a vLLM-served
    model it knows (the node config's own options win). A catalog template is a file of vLLM's
    ``examples/`` that the node's directory must hold (docs/deploy-h200.md)."""
    spec = catalog.models.get(model.name)
    if spec is None:
        return {}
    out: dict[str, Any] = {}
    if spec.tool_parser:
        out["tool_parser"] = spec.tool_parser
    if spec.reasoning_parser:
        out["reasoning_parser"] = spec.reasoning_parser
    if spec.chat_template and "chat_template" not in model.options:
        path = config.base_dir / spec.chat_template
        if not path.is_file():
            raise NodeConfigError(
                f"model {model.name}: its tools need vLLM's chat template "
                f"{spec.chat_template} (from vLLM's examples/) next to the node config, or a "
                "chat_template option"
            )
        out["chat_template"] = str(path)
    return out


def _vllm_node_memory(engines: Iterable[Engine]) -> NodeMemory:
    """A vLLM node's capacity, for co-residency: one GPU's memory when every engine is on the
    GPU path and knows it (engines then fit together when their ``gpu_memory_utilization``
    shares sum to at most 1); unbounded otherwise (the CPU gate: all stay resident)."""
    sizes = [getattr(e, "device_bytes", None) for e in engines]
    known = [s for s in sizes if s is not None]
    if sizes and len(known) == len(sizes):
        return NodeMemory(min(known), 0.0)
    return NodeMemory(float("inf"), 0.0)


def build_node_from_config(config: NodeConfig, catalog: Catalog, clock: Clock) -> BuiltNode:
    """Simulated engines from the catalog and vLLM engines from model directories, one node.

    vLLM engines manage their own KV memory (their ``needed_bytes`` is 0), so the node's byte
    accounting only binds the simulated ones."""
    flags = policy_flags(config.policy)
    sim_models = [m for m in config.models if m.engine == "sim"]
    memory = NodeMemory(float("inf"), 0.0)
    if sim_models:
        specs = [catalog.model(m.name) for m in sim_models]
        memory = node_memory(catalog.server(config.server), specs)
    pcie = PcieLink(clock)
    device = DeviceShare()
    engines: dict[str, Engine] = {}
    for model in config.models:
        if model.engine == "sim":
            spec = catalog.model(model.name)
            cost = CostModel(spec, catalog.server(config.server), catalog.profile(config.profile))
            engines[model.name] = SimEngine(
                spec, cost, memory, pcie, clock, config.name, flags.host_kv, device=device
            )
        else:
            from talaria.runtime.engines.vllm import build_vllm_engine

            engines[model.name] = build_vllm_engine(
                config.model_dir(model),
                model.name,
                clock,
                config.name,
                cost=_calibrated_cost(config, catalog, model.name),
                **{**_serving_defaults(config, catalog, model), **model.options},
            )
    if not sim_models:
        memory = _vllm_node_memory(engines.values())
    scheduler = NodeScheduler(
        config.name, engines, memory, clock, flags, SchedulerConfig(quantum_s=config.quantum_s),
        pcie,
    )  # fmt: skip
    return BuiltNode(scheduler, engines)
