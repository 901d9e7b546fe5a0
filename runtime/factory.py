"""Build a node: its engines, memory, PCIe link and scheduler, from the catalog.

``build_sim_node`` (simulated engines only) is used by the simulator's replay and by the
proxy's embedded runtime, so both run the same node. ``build_node_from_config`` builds the node
of a runtime server's config, each model's engine by the builder ``ENGINES`` registers under
the config's ``engine`` name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from talaria.core.catalog import Catalog
from talaria.core.clock import Clock
from talaria.core.groups import GroupError, check_fits, group_server
from talaria.core.model_spec import ModelSpec
from talaria.core.server_spec import ServerSpec
from talaria.runtime.config import ModelConfig, NodeConfig, NodeConfigError
from talaria.runtime.config_fields import ENGINE_FIELDS, Field
from talaria.runtime.costmodel import CostModel
from talaria.runtime.engine import Engine
from talaria.runtime.engines.sim import SimEngine
from talaria.runtime.engines.sim_reply import DEFAULT_REPLIES, ReplyPolicy
from talaria.runtime.memory.resources import DeviceShare, NodeMemory, PcieLink
from talaria.runtime.placement_rules import UPSTREAM_PLACEABLE, VLLM_PLACEABLE, OptionKind
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import SchedulerFlags, policy_flags
from talaria.runtime.scheduling.node import NodeScheduler
from talaria.runtime.scheduling.policies.compose import PolicyChoice

HOST_RESERVE_FRACTION = 0.1
"""Host DRAM kept for the OS and the serving processes (est.); the rest, less the pinned weight
copies of every hosted model, is the host KV tier."""
HOST_KV_FLOOR_BYTES = 500e9
"""Host DRAM a node keeps for paused sessions' KV beyond its models' pinned weights (the
cluster preset's layout keeps ≥ 500 GB, sim/presets.py)."""


def pinned_weight_budget_bytes(server: ServerSpec) -> float:
    """The pinned weight copies a node may hold, so that each hosted model can be woken:
    host DRAM × (1 − ``HOST_RESERVE_FRACTION``) − ``HOST_KV_FLOOR_BYTES`` × the server's
    ``node_share`` (a GPU group keeps its share of the node's floor; what a placement packs
    models into, sim/placement.py, and a live node reports in its status)."""
    floor = HOST_KV_FLOOR_BYTES * server.node_share
    return server.host_dram_bytes * (1 - HOST_RESERVE_FRACTION) - floor


def node_memory(server: ServerSpec, models: Sequence[ModelSpec]) -> NodeMemory:
    """HBM: the server's usable HBM. Host KV tier: host DRAM × (1 − reserve) − the pinned weight
    copies of every hosted model (so each can be woken)."""
    host_kv = server.host_dram_bytes * (1 - HOST_RESERVE_FRACTION) - sum(
        m.weight_bytes for m in models
    )
    return NodeMemory(server.usable_hbm_bytes, host_kv)


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


@dataclass
class BuiltNode:
    """A node built from a config, with the engines that need starting and stopping."""

    node: NodeScheduler
    engines: dict[str, Engine]
    host_weight_bytes: dict[str, float] = field(default_factory=dict)
    """Per model: its pinned host weight copy, outside the host KV tier (0 or absent: an
    engine that keeps its own memory)."""


def _calibrated_cost(config: NodeConfig, catalog: Catalog, model: str) -> CostModel | None:
    """The cost model of a vLLM-served ``model`` if the node's profile has a ``StepFit`` for it
    (and the catalog knows the model), else None (the engine's rate defaults apply)."""
    profile = catalog.profile(config.profile)
    if model not in profile.fitted or model not in catalog.models:
        return None
    return CostModel(catalog.model(model), config.server_spec(catalog), profile)


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


def _device_memory(engines: Iterable[Engine]) -> NodeMemory:
    """The capacity of a node none of whose engines keeps its KV in ``NodeMemory`` (vLLM's),
    for co-residency: one GPU's memory when every engine is on the GPU path and knows it
    (``device_bytes``; engines then fit together when their ``gpu_memory_utilization`` shares
    sum to at most 1); unbounded otherwise (the CPU gate: all stay resident)."""
    sizes = [getattr(e, "device_bytes", None) for e in engines]
    known = [s for s in sizes if s is not None]
    if sizes and len(known) == len(sizes):
        return NodeMemory(min(known), 0.0)
    return NodeMemory(float("inf"), 0.0)


@dataclass(frozen=True)
class EngineSite:
    """What an engine builder gets: the node's config, the model's entry in it, the catalog,
    the clock, and what the node's engines share (memory, PCIe link, device)."""

    config: NodeConfig
    model: ModelConfig
    catalog: Catalog
    clock: Clock
    policy: PolicyChoice
    """The node's choice of policies (what a switch keeps; the KV eviction order)."""
    memory: NodeMemory
    pcie: PcieLink
    device: DeviceShare


class EngineStartError(RuntimeError):
    """A model placed on a running node could not be built or started (``place_model``)."""


@dataclass(frozen=True)
class EngineKind:
    """One registered engine: how to build it for a model of a node config."""

    build: Callable[[EngineSite], Engine]
    uses_node_memory: bool
    """Its KV and weights live in the node's ``NodeMemory``, sized from the catalog specs of
    the models of such engines (the simulated engine: its ``MemoryAccounting``, said here
    before it is built). An engine that manages its own memory (vLLM) says False; a node of
    only such engines gets ``_device_memory``."""
    loads_on_clock: bool = False
    """Its start takes no real time (the simulated engine): placed on a running node, it
    serves only after the time a real load would take on the node's clock
    (``ServerSpec.placement_s`` from storage: a live runtime loads from its model's path)."""
    options: Mapping[str, OptionKind] = field(default_factory=dict)
    """The ``[[model]]`` options (besides name, engine, path) a model placed over HTTP may
    set, each with how it is checked (runtime/placement_rules.py); a node's own TOML may set
    any."""
    fields: Mapping[str, Field] = field(default_factory=dict)
    """What its ``[[model]]`` options may hold (its table in runtime/config_fields.py's
    ``ENGINE_FIELDS``), checked when a node TOML or a placement is parsed."""


def _build_sim(site: EngineSite) -> Engine:
    """A ``SimEngine`` of a catalog model, timed by the node's server (or GPU group) and
    profile; on a group, a model that does not fit it is a ``NodeConfigError`` naming the
    model and the numbers."""
    config = site.config
    spec = site.catalog.model(site.model.name)
    server = config.server_spec(site.catalog)
    if config.gpus is not None:
        try:
            check_fits(spec, site.catalog.server(config.server), len(config.gpus))
        except GroupError as exc:
            raise NodeConfigError(f"node {config.name}: {exc}") from exc
    cost = CostModel(spec, server, site.catalog.profile(config.profile))
    return SimEngine(
        spec,
        cost,
        site.memory,
        site.pcie,
        site.clock,
        config.name,
        site.policy.kv_on_host,
        device=site.device,
        class_eviction=site.policy.evicts_by_class,
    )


def _build_vllm(site: EngineSite) -> Engine:
    """A ``VLLMEngine`` of a model directory (vLLM is imported only here, lazily); on a GPU
    group its ``tensor_parallel_size`` is the group's size (another given value is a
    ``NodeConfigError``)."""
    from talaria.runtime.engines.vllm import build_vllm_engine

    config, model = site.config, site.model
    options = {**_serving_defaults(config, site.catalog, model), **model.options}
    if config.gpus is not None:
        tp = options.setdefault("tensor_parallel_size", len(config.gpus))
        if tp != len(config.gpus):
            raise NodeConfigError(
                f"model {model.name}: tensor_parallel_size {tp} on node {config.name}'s group "
                f"of {len(config.gpus)} GPUs {list(config.gpus)}: it must be the group's size"
            )
    return build_vllm_engine(
        config.model_dir(model),
        model.name,
        site.clock,
        config.name,
        cost=_calibrated_cost(config, site.catalog, model.name),
        **options,
    )


def _build_upstream(site: EngineSite) -> Engine:
    """An ``UpstreamEngine``: the model served by an OpenAI-compatible server at its ``url``
    (runtime/engines/upstream/, docs/upstream.md)."""
    from talaria.runtime.engines.upstream import build_upstream_engine

    return build_upstream_engine(site.model.name, site.model.options, site.clock, site.config.name)


ENGINES: dict[str, EngineKind] = {
    "sim": EngineKind(_build_sim, uses_node_memory=True, loads_on_clock=True),
    "vllm": EngineKind(_build_vllm, uses_node_memory=False, options=VLLM_PLACEABLE,
                       fields=ENGINE_FIELDS["vllm"]),
    "openai": EngineKind(_build_upstream, uses_node_memory=False, options=UPSTREAM_PLACEABLE,
                         fields=ENGINE_FIELDS["openai"]),
}  # fmt: skip
"""The engines a node may build (``engine = "..."``): those ``ENGINE_FIELDS`` names, each with
its builder (a test may register one more, which only a placement can name)."""


def engine_fields() -> dict[str, Mapping[str, Field]]:
    """``ENGINES``' names and option tables, as ``config.model_config`` checks them."""
    return {name: kind.fields for name, kind in ENGINES.items()}


def engine_kind(name: str) -> EngineKind:
    """The registered engine ``name``; an unknown name is a ``NodeConfigError`` listing the
    known ones."""
    kind = ENGINES.get(name)
    if kind is None:
        raise NodeConfigError(f"unknown engine {name!r}; known engines: {', '.join(ENGINES)}")
    return kind


def build_node_from_config(config: NodeConfig, catalog: Catalog, clock: Clock) -> BuiltNode:
    """One node of the engines its config names, each built by its registered ``EngineKind``.

    The node's byte accounting (``NodeMemory``) binds only engines that keep their memory there
    (the simulated ones, sized from their catalog specs); a node of only self-managing engines
    (vLLM's, without ``MemoryAccounting``) gets its device's memory (``_device_memory``)."""
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
        memory = _device_memory(engines.values())
    scheduler = NodeScheduler(
        config.name, engines, memory, clock, policy, SchedulerConfig(quantum_s=config.quantum_s),
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
