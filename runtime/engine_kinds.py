"""The engines a node may build, by the name a ``[[model]]`` entry gives (``engine = "..."``):
the registry ``ENGINES``, each ``EngineKind`` with its builder, what it keeps in the node's
memory, how it loads, and the options a model of it may set; ``EngineSite``, what a builder
gets; and the builders of the simulated, vLLM and upstream engines.

Adding an engine: one line in ``ENGINES`` with its builder, and its options' table in
runtime/config_fields.py ``ENGINE_FIELDS`` (which runtime/config.py reads without importing
this module).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from talaria.core.catalog import Catalog
from talaria.core.clock import Clock
from talaria.core.groups import GroupError, check_fits
from talaria.runtime.config import ModelConfig, NodeConfig, NodeConfigError
from talaria.runtime.config_fields import ENGINE_FIELDS, Field
from talaria.runtime.costmodel import CostModel
from talaria.runtime.engine import Engine
from talaria.runtime.engines.sim import SimEngine
from talaria.runtime.memory.resources import DeviceShare, NodeMemory, PcieLink
from talaria.runtime.placement_rules import UPSTREAM_PLACEABLE, VLLM_PLACEABLE, OptionKind
from talaria.runtime.scheduling.policies.compose import PolicyChoice


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


@dataclass(frozen=True)
class EngineKind:
    """One registered engine: how to build it for a model of a node config."""

    build: Callable[[EngineSite], Engine]
    uses_node_memory: bool
    """Its KV and weights live in the node's ``NodeMemory``, sized from the catalog specs of
    the models of such engines (the simulated engine: its ``MemoryAccounting``, said here
    before it is built). An engine that manages its own memory (vLLM) says False; a node of
    only such engines gets ``device_memory`` (runtime/memory/sizing.py)."""
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


def _calibrated_cost(config: NodeConfig, catalog: Catalog, model: str) -> CostModel | None:
    """The cost model of a vLLM-served ``model`` if the node's profile has a ``StepFit`` for it
    (and the catalog knows the model), else None (the engine's rate defaults apply)."""
    profile = catalog.profile(config.profile)
    if model not in profile.fitted or catalog.find(model) is None:
        return None
    return CostModel(catalog.model(model), config.server_spec(catalog), profile)


def _serving_defaults(config: NodeConfig, catalog: Catalog, model: ModelConfig) -> dict[str, Any]:
    """The catalog's tool-call and reasoning parsers and chat template for a vLLM-served
    model it knows (the node config's own options win). A catalog template is a file of vLLM's
    ``examples/`` that the node's directory must hold (docs/deploy-h200.md)."""
    spec = catalog.find(model.name)
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
