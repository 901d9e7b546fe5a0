"""How big a node's memory is: its HBM and host KV tier from its server and hosted models
(``node_memory``), the pinned weight copies it may hold (``pinned_weight_budget_bytes``), and
the capacity of a node whose engines keep their own memory (``device_memory``).

Host DRAM is laid out as: a reserve for the OS and the serving processes
(``HOST_RESERVE_FRACTION``), the pinned weight copies of the hosted models (so each can be
woken from host DRAM) while ``pinned_weight_budget_bytes`` lasts — a model past it reads its
weights from the node's local NVMe on each wake (host_weights.py decides, by demand, which
models keep copies) — and the rest the host KV tier, of which a node keeps at least
``HOST_KV_FLOOR_BYTES`` for paused sessions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from talaria.core.model_spec import ModelSpec
from talaria.core.server_spec import ServerSpec
from talaria.runtime.memory.host_weights import HostWeights
from talaria.runtime.memory.resources import NodeMemory

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
    copies. Every hosted model gets a copy when they all fit host DRAM × (1 − reserve), or
    when the server knows no NVMe rate (as before the tiers); otherwise one per model in order
    while ``pinned_weight_budget_bytes`` lasts (the host KV floor kept), the others on NVMe."""
    weight_bytes = {m.name: m.weight_bytes for m in models}
    room = server.host_dram_bytes * (1 - HOST_RESERVE_FRACTION)
    if server.nvme_read_bytes_per_s <= 0:
        weights = HostWeights()
    elif sum(weight_bytes.values()) <= room:
        weights = HostWeights(room)
    else:
        weights = HostWeights(pinned_weight_budget_bytes(server))
    memory = NodeMemory(server.usable_hbm_bytes, room - weights.start(weight_bytes))
    memory.host_weights = weights
    return memory


def device_memory(engines: Iterable[object]) -> NodeMemory:
    """The capacity of a node none of whose engines keeps its KV in ``NodeMemory`` (vLLM's),
    for co-residency: one GPU's memory when every engine is on the GPU path and knows it
    (``device_bytes``; engines then fit together when their ``gpu_memory_utilization`` shares
    sum to at most 1); unbounded otherwise (the CPU gate: all stay resident)."""
    sizes = [getattr(e, "device_bytes", None) for e in engines]
    known = [s for s in sizes if s is not None]
    if sizes and len(known) == len(sizes):
        return NodeMemory(min(known), 0.0)
    return NodeMemory(float("inf"), 0.0)
