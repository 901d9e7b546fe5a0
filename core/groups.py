"""GPU groups: a server's GPUs split into groups of 1, 2, 4 or 8, each serving its models with
tensor parallelism over the group (TP = the group's size), as an operator deploys a model on
the smallest group that holds it rather than on a whole 8-GPU node (issue 40).

A group is a ``ServerSpec`` of its own (``group_server``): ``gpus`` = the group's size, every
per-GPU figure unchanged, so the cost model's aggregates (compute, HBM bandwidth, PCIe: each
``gpus`` × the per-GPU figure, runtime/costmodel.py) scale with the group, and the host's
memory and local NVMe are shared in proportion (``host_dram_bytes``, ``nvme_read_bytes_per_s``,
``nvme_bytes`` and ``node_share`` × size / the server's GPUs: runtime/memory/sizing.py's
pinned-weight budget keeps that share of a node's host KV). TP
communication is not a term of its own: the efficiency profile's factors, sourced at TP = 8,
carry it at every size (docs/sources.md §14), which overstates a small group's step time
slightly (it talks less).

KV bytes at TP = g (``kv_bytes_per_token_at``): every rank stores its share of the KV heads,
at least one head, so a model with fewer KV heads than ranks stores copies: bytes ×
``kv_copies(model, g)`` = max(1, ⌈kv_heads / g⌉) × g / kv_heads; an MLA latent is kept whole on
every rank: × g. The catalog's ``kv_bytes_per_token_tp8`` is the g = 8 case (a test checks it
for the shipped models).

The memory floor of a model on a group (``memory_floor_bytes``): its weights plus one
full-context sequence's KV, which must fit the group's usable HBM (size × HBM ×
``gpu_memory_utilization``), the rule by which vLLM refuses to start an engine whose KV pool
cannot hold one ``max_model_len`` sequence (docs/sources.md §14).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from talaria.core.catalog import Catalog
from talaria.core.catalog_error import CatalogError
from talaria.core.model_spec import ModelSpec
from talaria.core.server_spec import ServerSpec

GROUP_SIZES = (1, 2, 4, 8)
"""The group sizes (TP degrees) a node's GPUs are split into."""


class GroupError(CatalogError):
    """A group size that is not 1, 2, 4 or 8 or exceeds the server, or a model that does not
    fit its group: the message names the model and the numbers."""


def check_group_size(size: int, server: ServerSpec) -> int:
    """``size`` if it is a group size the server can host, else ``GroupError``."""
    if size not in GROUP_SIZES:
        raise GroupError(f"a GPU group has 1, 2, 4 or 8 GPUs, not {size}")
    if size > server.gpus:
        raise GroupError(f"a group of {size} GPUs exceeds server {server.name}'s {server.gpus}")
    return size


def group_server(server: ServerSpec, size: int) -> ServerSpec:
    """The server as a group of ``size`` of its GPUs (module docstring); the server itself
    when ``size`` is all of them."""
    check_group_size(size, server)
    if size == server.gpus:
        return server
    return replace(
        server,
        name=f"{server.name}/{size}",
        gpus=size,
        host_dram_bytes=server.host_dram_bytes * size / server.gpus,
        nvme_read_bytes_per_s=server.nvme_read_bytes_per_s * size / server.gpus,
        nvme_bytes=server.nvme_bytes * size / server.gpus,
        node_share=server.node_share * size / server.gpus,
    )


def kv_copies(model: ModelSpec, tp: int) -> float:
    """How many times TP = ``tp`` stores each KV byte (module docstring)."""
    if model.is_mla:
        return float(tp)
    return max(1, math.ceil(model.kv_heads / tp)) * tp / model.kv_heads


def kv_bytes_per_token_at(model: ModelSpec, tp: int) -> float:
    """Physical KV bytes per token over ``tp`` ranks: kv_bytes_per_token × kv_copies."""
    return model.kv_bytes_per_token * kv_copies(model, tp)


def kv_fixed_bytes_per_seq_at(model: ModelSpec, tp: int) -> float:
    """A sequence's fixed KV (sliding-window layers) over ``tp`` ranks: the catalog's TP = 8
    figure × kv_copies(tp) / kv_copies(8)."""
    if model.kv_fixed_bytes_per_seq_tp8 == 0:
        return 0.0
    return model.kv_fixed_bytes_per_seq_tp8 * kv_copies(model, tp) / kv_copies(model, 8)


def memory_floor_bytes(model: ModelSpec, tp: int) -> float:
    """weight_bytes + one context_window_tokens sequence's KV at TP = ``tp``."""
    kv = kv_bytes_per_token_at(model, tp) * model.context_window_tokens
    return model.weight_bytes + kv + kv_fixed_bytes_per_seq_at(model, tp)


def fit_together(models: Sequence[ModelSpec], server: ServerSpec, size: int) -> bool:
    """Whether the models can be resident together on a group of ``size`` GPUs: Σ weights +
    the largest one-sequence KV floor ≤ the group's usable HBM (the node scheduler's
    resident-set rule, runtime/scheduling/slots.py ``resident_set``)."""
    weights = sum(m.weight_bytes for m in models)
    kv = max(memory_floor_bytes(m, size) - m.weight_bytes for m in models)
    return weights + kv <= group_server(server, size).usable_hbm_bytes


def fits(model: ModelSpec, server: ServerSpec, size: int) -> bool:
    """Whether the model's memory floor fits a group of ``size`` GPUs of ``server``."""
    return memory_floor_bytes(model, size) <= group_server(server, size).usable_hbm_bytes


def smallest_group(model: ModelSpec, server: ServerSpec) -> int:
    """The fewest GPUs of ``server`` (a group size) that hold the model; ``GroupError`` when
    not even the whole server does."""
    for size in GROUP_SIZES:
        if size <= server.gpus and fits(model, server, size):
            return size
    largest = max(s for s in GROUP_SIZES if s <= server.gpus)
    need = memory_floor_bytes(model, largest) / 1e9
    room = group_server(server, largest).usable_hbm_bytes / 1e9
    raise GroupError(
        f"model {model.name} needs {need:,.0f} GB (weights + one {model.context_window_tokens:,}"
        f"-token sequence's KV) but {largest} GPUs of {server.name} hold {room:,.0f} GB"
    )


def check_fits(model: ModelSpec, server: ServerSpec, size: int) -> None:
    """``GroupError`` naming the model and the numbers unless it fits a group of ``size``."""
    check_group_size(size, server)
    if not fits(model, server, size):
        need = memory_floor_bytes(model, size) / 1e9
        room = group_server(server, size).usable_hbm_bytes / 1e9
        raise GroupError(
            f"model {model.name} does not fit a group of {size} GPUs of {server.name}: it needs "
            f"{need:,.0f} GB (weights + one {model.context_window_tokens:,}-token sequence's "
            f"KV) of the group's {room:,.0f} GB; its smallest group is "
            f"{smallest_group(model, server)}"
        )


def group_floor(catalog: Catalog, model: str, server: str) -> int | None:
    """The fewest GPUs of ``server`` that hold ``model``, by names (the proxy's placement loop
    asks it of the runtimes' models); None when the catalog knows either not; more than the
    server's GPUs when not even all of them do."""
    if catalog.find(model) is None or server not in catalog.servers:
        return None
    try:
        return smallest_group(catalog.model(model), catalog.server(server))
    except GroupError:
        return catalog.server(server).gpus + 1
