"""Where a model's weights can be, and what loading them into HBM from there costs (issue 48).

Tiers, fastest first (``WeightTier``), each with its rate from the server's catalog entry
(core/data/servers/h200x8.toml; docs/sources.md §16):

- ``hbm``: resident; nothing to load;
- ``host``: a pinned copy in the node's host DRAM (shared with paused sessions' KV): the
  sleep-mode wake, weights ÷ (GPUs × ``weight_wake_bytes_per_s_per_gpu``);
- ``nvme``: the node's local NVMe, read by a fast loader: weights ÷ ``nvme_read_bytes_per_s``
  (a GPU group: its share of the node's);
- ``peer``: a peer node's host DRAM over the compute fabric: weights ÷
  ``peer_network_bytes_per_s``;
- ``storage``: remote storage through the engine's default loader: weights ÷
  ``storage_read_bytes_per_s``.

An engine kept initialised without its weights (vLLM's sleep level 2: weights discarded, the
process, its CUDA graphs and its KV pool reservation kept) pays only the read; a fresh engine
adds ``engine_init_s``:

    load_s(tier) = weight_bytes / rate(tier) + (engine_init_s if fresh else 0)

A replica loads from the fastest tier that holds its weights (``fastest``).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from talaria.core.catalog_error import CatalogError
from talaria.core.server_spec import ServerSpec


class WeightTier(StrEnum):
    """Where a model's weights are, fastest first."""

    HBM = "hbm"
    HOST = "host"
    NVME = "nvme"
    PEER = "peer"
    STORAGE = "storage"


ORDER = tuple(WeightTier)
"""The tiers, fastest first."""


def rate_bytes_per_s(server: ServerSpec, tier: WeightTier) -> float:
    """How fast weights come into the server's HBM from ``tier`` (module docstring); inf for
    ``hbm``; ``CatalogError`` when the server does not know the rate (0)."""
    rates = {
        WeightTier.HBM: float("inf"),
        WeightTier.HOST: server.gpus * server.weight_wake_bytes_per_s_per_gpu,
        WeightTier.NVME: server.nvme_read_bytes_per_s,
        WeightTier.PEER: server.peer_network_bytes_per_s,
        WeightTier.STORAGE: server.storage_read_bytes_per_s,
    }
    rate = rates[tier]
    if rate <= 0:
        raise CatalogError(f"server {server.name} has no rate for weights from {tier.value}")
    return rate


def load_s(server: ServerSpec, weight_bytes: float, tier: WeightTier, fresh: bool) -> float:
    """Seconds until a model's weights serve from HBM, read from ``tier``; ``fresh``: a new
    engine (its start, ``engine_init_s``, on top), else one kept initialised (sleep level 2)."""
    read = 0.0 if tier is WeightTier.HBM else weight_bytes / rate_bytes_per_s(server, tier)
    return read + (server.engine_init_s if fresh else 0.0)


def fastest(tiers: Iterable[WeightTier]) -> WeightTier:
    """The fastest of the tiers that hold a model's weights (``ValueError`` if none)."""
    held = set(tiers)
    for tier in ORDER:
        if tier in held:
            return tier
    raise ValueError("no tier holds the weights")
