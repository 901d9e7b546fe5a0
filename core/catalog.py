"""Model catalog and server specs, loaded from TOML data files.

The package ships ``data/models/*.toml`` (one model per file), ``data/servers/*.toml`` (one
server per file) and ``data/profiles/*.toml`` (efficiency profiles); every figure in them
carries its source in a comment. Users add their own files in any directory passed as
``extra_dirs`` (or listed in ``TALARIA_CATALOG_PATH``, ``os.pathsep``-separated); a directory
may hold ``models/``, ``servers/`` and ``profiles/`` subfolders or the TOML files directly (a
file with a ``[server]`` table is a server, one with ``[model]`` a model, one with
``[profile]`` a profile). A user file with the same ``name`` as a shipped one replaces it.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from importlib import resources
from itertools import pairwise
from pathlib import Path
from typing import Any

BYTES_PER_PARAM = {"fp8": 1.0, "bf16": 2.0, "mxfp4": 0.53125, "int4": 0.5625}
"""Bytes per weight by dtype. MXFP4 packs 4-bit values plus one 8-bit scale per 32: 4.25/8;
INT4 (weight-only, group 32, one 16-bit scale per group, as Kimi-K2-Thinking's experts): 4.5/8."""


MODEL_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*(@[a-z0-9][a-z0-9._-]*)?")
"""The grammar of a model's name: what the catalog's names use (lower-case letters, digits,
``.``, ``-``, and ``_`` as in a GGUF file's served name, runtime/gguf.py), starting with a letter
or a digit, with at most one ``@`` for a variant (``base@name``). No ``/``, so that a name is
one segment of a URL path (``DELETE /v1/runtime/models/{name}``), no blank, no upper case."""
MODEL_NAME_MAX_CHARS = 128


def model_name_fault(name: str) -> str | None:
    """Why ``name`` is not a model name (``MODEL_NAME``, at most ``MODEL_NAME_MAX_CHARS``
    characters), or None."""
    if len(name) <= MODEL_NAME_MAX_CHARS and MODEL_NAME.fullmatch(name):
        return None
    return (
        f"model name {name[:MODEL_NAME_MAX_CHARS]!r} is not a model name: lower-case letters, "
        f"digits, '.', '-' and '_' (one '@' for a variant), starting with a letter or a digit, "
        f"at most {MODEL_NAME_MAX_CHARS} characters"
    )


class CatalogError(ValueError):
    """A catalog file is missing a field, has a wrong type, or names an unknown entry."""


@dataclass(frozen=True)
class ModelSpec:
    """One model as the cost model sees it.

    KV bytes per token (bf16 KV) = 2 (K and V) × layers × kv_heads × head_dim × 2 bytes; for MLA
    it is layers × (kv_lora_rank + rope_dim) × 2 bytes. ``kv_bytes_per_token_tp8`` is what a TP=8
    deployment physically stores summed over the 8 ranks (kv heads replicated up to 8; the MLA
    latent kept whole on every rank).
    """

    name: str
    hf_id: str
    total_params: float
    active_params: float
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    weight_dtype: str
    weight_bytes: float
    kv_bytes_per_token: int
    kv_bytes_per_token_tp8: int
    context_window_tokens: int
    num_experts: int = 0
    experts_per_token: int = 0
    mla_kv_lora_rank: int = 0
    mla_rope_dim: int = 0
    kv_fixed_bytes_per_seq_tp8: int = 0
    attention_window_tokens: int = 0
    attention_window_layer_fraction: float = 0.0
    reasoning: bool = False
    tool_parser: str = ""
    """vLLM's ``--tool-call-parser`` for this model (a node serving it on vLLM uses it; ""
    for none)."""
    reasoning_parser: str = ""
    """vLLM's ``--reasoning-parser`` ("": the model gives no separate reasoning)."""
    chat_template: str = ""
    """A chat template vLLM needs instead of the checkpoint's own, for tools (a file name
    from vLLM's ``examples/``, as its tool-calling docs name it; "": the checkpoint's)."""

    @property
    def is_moe(self) -> bool:
        """A mixture-of-experts model (it has routed experts)."""
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """The model uses multi-head latent attention (an MLA KV latent rank is set)."""
        return self.mla_kv_lora_rank > 0

    @property
    def expert_params(self) -> float:
        """Parameters held in routed experts.

        active = dense + (k / E) × experts and total = dense + experts give
        experts = (total − active) × E / (E − k). Zero for dense models.
        """
        if not self.is_moe:
            return 0.0
        e, k = self.num_experts, self.experts_per_token
        return (self.total_params - self.active_params) * e / (e - k)

    @property
    def dense_params(self) -> float:
        """Parameters every token touches (attention, shared experts, embeddings)."""
        return self.total_params - self.expert_params

    @property
    def bytes_per_param(self) -> float:
        """Average weight bytes per parameter: weight_bytes / total_params."""
        return self.weight_bytes / self.total_params


@dataclass(frozen=True)
class ServerSpec:
    """One multi-GPU server (all figures per GPU unless the name says otherwise)."""

    name: str
    gpus: int
    hbm_bytes_per_gpu: float
    hbm_bytes_per_s_per_gpu: float
    dense_flops_per_s_per_gpu: dict[str, float]
    pcie_peak_bytes_per_s_per_gpu: float
    pcie_pinned_bytes_per_s_per_gpu: float
    nvlink_bytes_per_s_per_gpu: float
    host_dram_bytes: float
    weight_wake_bytes_per_s_per_gpu: float
    weight_sleep_bytes_per_s_per_gpu: float
    gpu_memory_utilization: float = 0.9
    peer_network_bytes_per_s: float = 0.0
    """Node to node, the whole node's fabric (a model's weights copied from a peer's host
    memory); 0: not known (placement then refuses to plan a peer copy)."""
    storage_read_bytes_per_s: float = 0.0
    """Weights read from storage by the engine's loader, the whole node; 0: not known."""
    engine_init_s: float = 0.0
    """Starting a new engine beyond reading its weights (process, compile, CUDA graphs)."""
    node_share: float = 1.0
    """The fraction of a physical server this is: a GPU group's GPUs ÷ the server's
    (core/groups.py ``group_server``); 1 for a whole server."""

    def placement_s(self, weight_bytes: float, from_peer: bool) -> float:
        """Seconds to place a model on this node: weights ÷ (the peer fabric's or the storage
        loader's rate) + the engine's start (``engine_init_s``)."""
        rate = self.peer_network_bytes_per_s if from_peer else self.storage_read_bytes_per_s
        if rate <= 0:
            field_name = "peer_network_bytes_per_s" if from_peer else "storage_read_bytes_per_s"
            raise CatalogError(f"server {self.name} has no {field_name}: placement needs it")
        return weight_bytes / rate + self.engine_init_s

    @property
    def hbm_bytes(self) -> float:
        """HBM of the whole server, bytes: gpus × hbm_bytes_per_gpu."""
        return self.gpus * self.hbm_bytes_per_gpu

    @property
    def usable_hbm_bytes(self) -> float:
        """HBM that weights and KV may use: gpus × HBM × gpu_memory_utilization (vLLM's knob;
        the rest is activations, CUDA context, NCCL buffers)."""
        return self.hbm_bytes * self.gpu_memory_utilization

    def flops_per_s(self, dtype: str) -> float:
        """Dense peak for ``dtype`` per GPU; MXFP4 runs on the FP8 path on Hopper, and INT4
        weight-only (W4A16: vLLM's WNA16 kernels dequantize to 16-bit) on the BF16 path."""
        key = {"mxfp4": "fp8", "int4": "bf16"}.get(dtype, dtype)
        try:
            return self.dense_flops_per_s_per_gpu[key]
        except KeyError as exc:
            raise CatalogError(f"server {self.name} has no FLOP/s for dtype {dtype!r}") from exc


@dataclass(frozen=True)
class StepFit:
    """A measured engine step time, fitted by ``talaria calibrate`` (least squares):

    t_step = overhead_s + s_per_token × n + s_per_pair × pairs + s_per_seq × seqs
             + mixed_step_s × [the step holds prefill chunks and decoding sequences both]

    n: tokens in the step (prefill chunk tokens + one per decoding sequence); pairs: attention
    token pairs (decode: the total context; a chunk of t tokens after c: t·c + t²/2); seqs:
    sequences in the step. ``mixed_step_s`` is what a step costs for mixing the two kinds (on
    vLLM's CPU build a mixed step costs about a prefill step plus a decode step, more than one
    shared overhead; docs/fidelity.md). It replaces the roofline's max(compute, memory) for
    its model.
    ``call_overhead_s`` is once per call, before its first step can take it: the engine's
    intake (tokenizing, handing the request to the engine process, scheduling it).
    ``idle_wake`` adds to the intake of a call that finds the engine idle: points
    (idle seconds, extra seconds), interpolated linearly and held flat past both ends (an
    engine that has slept longer answers its next call later; ``talaria calibrate`` measures
    the ladder). ``new_shape_s`` adds to a step whose token count n the engine has not run
    before (vLLM's CPU build builds its matrix-product kernels per shape and keeps them: a
    prefill of a fresh size costs 4–6 ms more the first time here; docs/fidelity.md)."""

    overhead_s: float
    s_per_token: float
    s_per_pair: float
    s_per_seq: float
    call_overhead_s: float = 0.0
    idle_wake: tuple[tuple[float, float], ...] = ()
    mixed_step_s: float = 0.0
    new_shape_s: float = 0.0

    def __post_init__(self) -> None:
        points = tuple((float(i), float(e)) for i, e in self.idle_wake)
        if any(b[0] <= a[0] for a, b in pairwise(points)):
            raise ValueError(f"idle_wake idle times must increase: {points}")
        object.__setattr__(self, "idle_wake", points)

    def wake_s(self, idle_s: float) -> float:
        """Extra intake after ``idle_s`` idle: ``idle_wake`` interpolated (0 with no points)."""
        points = self.idle_wake
        if not points:
            return 0.0
        if idle_s <= points[0][0]:
            return points[0][1]
        for (x0, y0), (x1, y1) in pairwise(points):
            if idle_s <= x1:
                return y0 + (y1 - y0) * (idle_s - x0) / (x1 - x0)
        return points[-1][1]

    def step_time_s(self, tokens: int, pairs: float, seqs: int, mixed: bool = False) -> float:
        """overhead_s + s_per_token·tokens + s_per_pair·pairs + s_per_seq·seqs, plus
        mixed_step_s for a step that mixes prefill and decode."""
        return (
            self.overhead_s
            + self.s_per_token * tokens
            + self.s_per_pair * pairs
            + self.s_per_seq * seqs
            + (self.mixed_step_s if mixed else 0.0)
        )


@dataclass(frozen=True)
class EfficiencyProfile:
    """Achieved fractions of peak and fixed overheads (docs/sources.md §4, est.), plus, per model,
    step times fitted on a real engine by ``talaria calibrate`` (``fitted``: model name →
    ``StepFit``; a model without one uses the roofline)."""

    name: str = "default"
    compute_efficiency: float = 0.3
    memory_efficiency: float = 0.7
    step_overhead_s: float = 0.005
    max_num_batched_tokens: int = 8192
    block_tokens: int = 16
    fitted: Mapping[str, StepFit] = field(default_factory=dict)
    transport_forward_s: float = 0.0
    """Proxy → node time of a call before the node sees it (status read, request over HTTP);
    measured by ``talaria calibrate``; 0 for a node in the proxy's process."""
    transport_return_s: float = 0.0
    """Node → proxy time of a call's answer (the response over HTTP)."""
    coresident_interference: float = 1.0
    """α of ``DeviceShare``: a step's device time grows by α × k while k other engines of
    the node are busy. 1 = the device time-sliced between them (GPUs without MPS,
    docs/sources.md §4); ``talaria calibrate`` measures it on engines that co-reside."""


@dataclass
class Catalog:
    """The loaded models, servers and efficiency profiles, each by name."""

    models: dict[str, ModelSpec] = field(default_factory=dict)
    servers: dict[str, ServerSpec] = field(default_factory=dict)
    profiles: dict[str, EfficiencyProfile] = field(default_factory=dict)

    def model(self, name: str) -> ModelSpec:
        """The model named ``name``; :class:`CatalogError` listing the known ones if none."""
        try:
            return self.models[name]
        except KeyError as exc:
            known = ", ".join(sorted(self.models))
            raise CatalogError(f"unknown model {name!r}; known: {known}") from exc

    def server(self, name: str) -> ServerSpec:
        """The server named ``name``; :class:`CatalogError` listing the known ones if none."""
        try:
            return self.servers[name]
        except KeyError as exc:
            known = ", ".join(sorted(self.servers))
            raise CatalogError(f"unknown server {name!r}; known: {known}") from exc

    def profile(self, name: str) -> EfficiencyProfile:
        """The efficiency profile named ``name``; :class:`CatalogError` if none."""
        try:
            return self.profiles[name]
        except KeyError as exc:
            known = ", ".join(sorted(self.profiles))
            raise CatalogError(f"unknown efficiency profile {name!r}; known: {known}") from exc


def _number_fault(kind: object, value: Any) -> str | None:
    """Why ``value`` cannot be a catalog field of annotation ``kind`` (``"float"``, ``"int"``;
    anything else: only its numbers are checked): a quoted number, a bool, a fraction for an
    integer, or NaN / ±infinity (TOML's ``nan`` and ``inf``), or None."""
    if kind in ("float", "int"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, not {value!r}"
        if kind == "int" and not isinstance(value, int):
            return f"must be an integer, not {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be finite, not {value!r}"
    if isinstance(value, dict | list | tuple):
        items = value.values() if isinstance(value, dict) else value
        return next((f for v in items if (f := _number_fault(None, v)) is not None), None)
    return None


def _build(cls: type[Any], table: dict[str, Any], source: str) -> Any:
    """``cls`` of a catalog ``table``; each of its numbers typed as ``cls`` declares the field
    and finite (else the cost model's estimates, and the node's status, carry NaN)."""
    for spec in fields(cls):
        fault = _number_fault(spec.type, table.get(spec.name, 0))
        if fault is not None:
            raise CatalogError(f"{source}: {spec.name} {fault}")
    try:
        return cls(**table)
    except (TypeError, ValueError) as exc:
        raise CatalogError(f"{source}: {exc}") from exc


def _load_file(path: Path, catalog: Catalog) -> None:
    with path.open("rb") as fh:
        try:
            doc = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise CatalogError(f"{path}: {exc}") from exc
    if "model" in doc:
        model: ModelSpec = _build(ModelSpec, doc["model"], str(path))
        fault = model_name_fault(model.name) if isinstance(model.name, str) else "needs a name"
        if fault is not None:
            raise CatalogError(f"{path}: {fault}")
        catalog.models[model.name] = model
    if "server" in doc:
        server: ServerSpec = _build(ServerSpec, doc["server"], str(path))
        catalog.servers[server.name] = server
    if "profile" in doc:
        table = dict(doc["profile"])
        fits = table.pop("fitted", {})
        if not isinstance(fits, dict):
            raise CatalogError(f"{path}: [profile.fitted] must be a table of models")
        table["fitted"] = {
            model: _build(StepFit, fit, f"{path}: [profile.fitted.{model}]")
            for model, fit in fits.items()
        }
        profile: EfficiencyProfile = _build(EfficiencyProfile, table, str(path))
        catalog.profiles[profile.name] = profile
    if not {"model", "server", "profile"} & doc.keys():
        raise CatalogError(f"{path}: expected a [model], [server] or [profile] table")


def _toml_files(directory: Path) -> Iterable[Path]:
    for sub in (directory, directory / "models", directory / "servers", directory / "profiles"):
        if sub.is_dir():
            yield from sorted(sub.glob("*.toml"))


def load_catalog(extra_dirs: Iterable[str | os.PathLike[str]] = ()) -> Catalog:
    """Shipped data, then ``TALARIA_CATALOG_PATH`` entries, then ``extra_dirs`` (later wins)."""
    catalog = Catalog(profiles={"default": EfficiencyProfile()})
    shipped = resources.files("talaria.core") / "data"
    with resources.as_file(shipped) as data_dir:
        for path in _toml_files(Path(data_dir)):
            _load_file(path, catalog)
    env_dirs = [d for d in os.environ.get("TALARIA_CATALOG_PATH", "").split(os.pathsep) if d]
    for directory in [*env_dirs, *extra_dirs]:
        path = Path(directory)
        if path.is_file():
            _load_file(path, catalog)
        elif path.is_dir():
            for file in _toml_files(path):
                _load_file(file, catalog)
        else:
            raise CatalogError(f"catalog path {path} does not exist")
    return catalog


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """2 (K, V) × layers × kv_heads × head_dim × dtype_bytes."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_bytes_per_token_tp(
    layers: int, kv_heads: int, head_dim: int, tp: int, dtype_bytes: int = 2
) -> int:
    """Physical bytes over ``tp`` ranks: each rank keeps max(1, kv_heads / tp) heads."""
    heads_per_rank = max(1, math.ceil(kv_heads / tp))
    return kv_bytes_per_token(layers, heads_per_rank * tp, head_dim, dtype_bytes)
