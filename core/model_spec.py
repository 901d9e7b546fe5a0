"""A model as the cost model sees it (``ModelSpec``, one ``[model]`` table of the catalog), the
grammar of a model's name, the bytes of a weight by dtype, and the KV bytes per token of an
attention shape."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

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


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """2 (K, V) × layers × kv_heads × head_dim × dtype_bytes."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_bytes_per_token_tp(
    layers: int, kv_heads: int, head_dim: int, tp: int, dtype_bytes: int = 2
) -> int:
    """Physical bytes over ``tp`` ranks: each rank keeps max(1, kv_heads / tp) heads."""
    heads_per_rank = max(1, math.ceil(kv_heads / tp))
    return kv_bytes_per_token(layers, heads_per_rank * tp, head_dim, dtype_bytes)
