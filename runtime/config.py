"""Node configuration for ``talaria runtime --config node.toml``.

```toml
[node]
name = "node0"          # instance name the proxy sees
policy = "talaria"      # scheduler flags: round, talaria, +flag (as in talaria replay)
quantum_s = 60.0
time_scale = 1.0        # simulated engines only: simulated seconds per real second
class_slowdown = 1.1    # the fair queue's bounds (runtime/scheduling/config.py): how much a
preempt_limit = 10      # lower class may slow a higher class's steps, how often a running
starvation_quanta = 2.0 # call may be held for one, and when a waiting call is promoted
server = "h200x8"       # the node's hardware (catalog)
profile = "default"
gpus = "0-3"            # optional: the GPU group this runtime serves (1, 2, 4 or 8 of the
                        # server's GPUs; `talaria runtime --gpus`, else CUDA_VISIBLE_DEVICES)

[[model]]
name = "glm-4.5-fp8"    # a catalog model, simulated
engine = "sim"

[[model]]
name = "tiny-a"
engine = "vllm"
path = "tiny-llama-a"   # a model directory: relative to this file, or a shipped tiny model
max_model_len = 2048
```
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from talaria.core.model_spec import model_name_fault
from talaria.runtime.config_fields import (
    ENGINE_FIELDS,
    FAIR_QUEUE_KEYS,
    NODE_FIELDS,
    Field,
    FieldError,
    check_fields,
)
from talaria.runtime.config_fields import NodeConfigError as NodeConfigError  # named here too
from talaria.runtime.scheduling.config import SchedulerConfig

if TYPE_CHECKING:
    from talaria.core.catalog import Catalog
    from talaria.core.server_spec import ServerSpec


@dataclass(frozen=True)
class ModelConfig:
    """One ``[[model]]`` of a node config."""

    name: str
    engine: str
    """An engine a node config may name (``sim``, ``vllm``, ``openai``: docs/upstream.md;
    runtime/config_fields.py ``ENGINE_FIELDS``, built by runtime/engine_kinds.py's ``ENGINES``)."""
    path: str | None = None
    """The vLLM model's directory (see ``NodeConfig.model_dir``)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Engine-specific settings (e.g. max_model_len, gpu_memory_utilization)."""


@dataclass(frozen=True)
class NodeConfig:
    """A node configuration file: its ``[node]`` table and its models, in order (the order is
    the scheduler's round-robin order)."""

    name: str
    models: tuple[ModelConfig, ...]
    policy: str = "talaria"
    quantum_s: float = 60.0
    time_scale: float = 1.0
    server: str = "h200x8"
    profile: str = "default"
    base_dir: Path = Path(".")
    """The config file's folder: relative model paths start here."""
    gpus: tuple[int, ...] | None = None
    """The GPU group this runtime serves: device ids of the server (core/groups.py; its
    size is the TP of its engines); None: the whole server."""
    fair_bounds: Mapping[str, float] = field(default_factory=dict)
    """The fair queue's bounds the ``[node]`` table sets (``FAIR_QUEUE_KEYS``); the others
    keep ``SchedulerConfig``'s defaults."""

    def scheduler_config(self) -> SchedulerConfig:
        """The node scheduler's constants: its quantum and the fair queue's bounds set here."""
        return SchedulerConfig(quantum_s=self.quantum_s, **self.fair_bounds)  # type: ignore[arg-type]

    def server_spec(self, catalog: Catalog) -> ServerSpec:
        """The node's hardware: the catalog's server, or the group of ``gpus`` of it;
        ``NodeConfigError`` for a group that is not 1, 2, 4 or 8 distinct GPUs of it."""
        from talaria.core.groups import GroupError, group_server

        server = catalog.server(self.server)
        if self.gpus is None:
            return server
        beyond = [g for g in self.gpus if g >= server.gpus]
        if beyond:
            raise NodeConfigError(
                f"node {self.name}: GPUs {beyond} are not GPUs of server {server.name} "
                f"(0-{server.gpus - 1})"
            )
        try:
            return group_server(server, len(self.gpus))
        except GroupError as exc:
            raise NodeConfigError(f"node {self.name}: gpus {list(self.gpus)}: {exc}") from exc

    def model_dir(self, model: ModelConfig) -> Path:
        """A vLLM model's directory: absolute, relative to the config file, or a shipped tiny
        model under talaria/runtime/models/."""
        if model.path is None:
            raise NodeConfigError(f"model {model.name}: engine 'vllm' needs a 'path'")
        candidate = Path(model.path)
        if candidate.is_absolute():
            return candidate
        local = self.base_dir / candidate
        if local.exists():
            return local
        shipped = Path(__file__).parent / "models" / candidate
        if shipped.exists():
            return shipped
        raise NodeConfigError(f"model {model.name}: no directory {model.path!r}")


def model_config(
    entry: Any, where: str, engines: Mapping[str, Mapping[str, Field]] = ENGINE_FIELDS
) -> ModelConfig:
    """One ``[[model]]`` entry (a TOML table, or the JSON body of the runtime's
    ``POST /v1/runtime/models``, which then holds it to runtime/placement_rules.py): ``name``
    (the catalog's grammar, core/model_spec.py ``MODEL_NAME``), ``engine`` (one of ``engines``,
    the engine names with their option tables; default ``sim``), ``path``, and the engine's
    options, checked against its table (runtime/config_fields.py: typed, finite, in range);
    ``NodeConfigError`` names what is wrong."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise NodeConfigError(f"{where}: every [[model]] needs a name")
    name = entry["name"]
    fault = model_name_fault(name)
    if fault is not None:
        raise NodeConfigError(f"{where}: {fault}")
    engine = entry.get("engine", "sim")
    if not isinstance(engine, str) or engine not in engines:
        raise NodeConfigError(
            f"{where}: model {name}: unknown engine {engine!r}; known engines: {', '.join(engines)}"
        )
    path = entry.get("path")
    if path is not None and not isinstance(path, str):
        raise NodeConfigError(f"{where}: model {name}: path must be a string")
    options = {k: v for k, v in entry.items() if k not in ("name", "engine", "path")}
    try:
        check_fields(engines[engine], options)
    except FieldError as exc:
        raise NodeConfigError(f"{where}: model {name}: {exc}") from None
    return ModelConfig(name, engine, path, options)


def parse_gpus(value: Any, where: str) -> tuple[int, ...]:
    """Device ids from ``"0-3"``, ``"4,5"``, ``"0-1,6"`` or a list of integers (the form of
    ``CUDA_VISIBLE_DEVICES`` and of ``--gpus``); ``NodeConfigError`` naming ``where`` for
    anything else or for a repeated id."""
    ids: list[int] = []
    try:
        if isinstance(value, list) and all(type(v) is int for v in value):
            ids = list(value)
        elif isinstance(value, str) and value.strip():
            for part in value.split(","):
                first, dash, last = part.strip().partition("-")
                ids += range(int(first), int(last if dash else first) + 1)
        else:
            raise ValueError(value)
    except ValueError:
        raise NodeConfigError(
            f'{where}: gpus must be device ids such as "0-3" or [4, 5], not {value!r}'
        ) from None
    if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
        raise NodeConfigError(f"{where}: gpus {value!r} must name distinct devices, from 0")
    return tuple(ids)


def load_node_config(path: str | Path) -> NodeConfig:
    """The node config of a TOML file (the module docstring shows one); a missing field, an
    unknown name or a value its table refuses (runtime/config_fields.py) is a
    ``NodeConfigError`` naming the file, the model and the field."""
    file = Path(path)
    try:
        doc = tomllib.loads(file.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise NodeConfigError(f"{file}: {exc}") from exc
    node = doc.get("node", {})
    entries = doc.get("model", [])
    if not isinstance(node, dict):
        raise NodeConfigError(f"{file}: [node] must be a table")
    if not isinstance(entries, list) or not entries:
        raise NodeConfigError(f"{file}: needs at least one [[model]]")
    unknown = set(node) - set(NODE_FIELDS)
    if unknown:
        raise NodeConfigError(f"{file}: unknown [node] keys {sorted(unknown)}")
    try:
        check_fields(NODE_FIELDS, node)
    except FieldError as exc:
        raise NodeConfigError(f"{file}: [node]: {exc}") from None
    models = [model_config(entry, str(file)) for entry in entries]
    names = [m.name for m in models]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise NodeConfigError(f"{file}: model {', '.join(twice)} listed twice")
    return NodeConfig(
        name=node.get("name", "node0"),
        models=tuple(models),
        policy=node.get("policy", "talaria"),
        quantum_s=float(node.get("quantum_s", 60.0)),
        time_scale=float(node.get("time_scale", 1.0)),
        server=node.get("server", "h200x8"),
        profile=node.get("profile", "default"),
        base_dir=file.parent,
        gpus=parse_gpus(node["gpus"], f"{file}: [node]") if "gpus" in node else None,
        fair_bounds={k: node[k] for k in FAIR_QUEUE_KEYS if k in node},
    )
