"""A multi-GPU server as the cost model and placement see it (``ServerSpec``, one ``[server]``
table of the catalog): memory, bandwidths, peak FLOP/s, and what placing a model on it costs."""

from __future__ import annotations

from dataclasses import dataclass

from talaria.core.catalog_error import CatalogError


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
    nvme_read_bytes_per_s: float = 0.0
    """Weights read from the node's local NVMe by a fast loader, the whole node; 0: not known
    (the node then keeps no weights there, core/weight_tiers.py)."""
    nvme_bytes: float = 0.0
    """The node's local NVMe for weights, the whole node."""
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
