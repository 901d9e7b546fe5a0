"""The pure part of the GPU check (bench/gpu/run.py): weight sizes from a model's config, the
line fitted to sleep / wake times, the roofline efficiencies read off fitted step times, and the
catalog files written from them. Nothing here needs a GPU; tests/unit/core/test_gpu_derive.py tests
it on made-up measurements.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def llama_parameters(config: Mapping[str, Any]) -> int:
    """Parameters of a Llama-shaped decoder (``LlamaForCausalLM`` config.json): per layer
    q = H·(n_h·d), k = v = H·(n_kv·d), o = (n_h·d)·H, MLP 3·H·I, two norms of H; plus the
    embedding V·H, the final norm H and the LM head V·H unless ``tie_word_embeddings``."""
    h = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    d = int(config.get("head_dim") or h // heads)
    inter = int(config["intermediate_size"])
    vocab = int(config["vocab_size"])
    layer = h * heads * d * 2 + h * kv_heads * d * 2 + 3 * h * inter + 2 * h
    head = 0 if config.get("tie_word_embeddings", False) else vocab * h
    return int(config["num_hidden_layers"]) * layer + vocab * h + h + head


def dense_config(base: Mapping[str, Any], hidden: int, layers: int) -> dict[str, Any]:
    """``base`` (a Llama config) resized to ``hidden`` × ``layers``, Llama-3's proportions
    (head dim 128, 4 query heads per KV head, MLP 3.5 × hidden), untied: a random-weight
    model of a chosen size that keeps ``base``'s vocabulary (its tokenizer still fits)."""
    heads = hidden // 128
    return {
        **base,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 4),
        "head_dim": 128,
        "intermediate_size": int(hidden * 3.5),
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
    }


@dataclass(frozen=True)
class Line:
    """t = fixed_s + bytes / bytes_per_s, least squares over (bytes, seconds) points."""

    fixed_s: float
    bytes_per_s: float
    points: int

    def as_dict(self) -> dict[str, float]:
        return {"fixed_s": self.fixed_s, "bytes_per_s": self.bytes_per_s, "points": self.points}


def fit_line(points: Sequence[tuple[float, float]]) -> Line | None:
    """The least-squares line through (bytes, seconds); None with fewer than two sizes or a
    slope that is not positive (times that do not grow with size measure no copy)."""
    sizes = {b for b, _ in points}
    if len(sizes) < 2:
        return None
    mean_b = statistics.fmean(b for b, _ in points)
    mean_t = statistics.fmean(t for _, t in points)
    var = sum((b - mean_b) ** 2 for b, _ in points)
    slope = sum((b - mean_b) * (t - mean_t) for b, t in points) / var
    if slope <= 0:
        return None
    return Line(mean_t - slope * mean_b, 1 / slope, len(points))


@dataclass(frozen=True)
class Efficiencies:
    """The default profile's roofline constants read off measured steps on one GPU:

    - ``step_overhead_s`` = the small model's decode step at batch 1 (its weights take
      microseconds to read, so the step is the fixed cost);
    - ``memory_efficiency`` η_m = W / (HBM bandwidth × (t_big − t_small)), the big dense
      model's batch-1 decode step beyond that fixed cost, read as its weights W streamed at
      η_m of peak;
    - ``compute_efficiency`` η_p = 2 · N / (s_per_token × dense peak): the big model's
      prefill seconds per token against 2 FLOPs per parameter.
    """

    step_overhead_s: float
    memory_efficiency: float
    compute_efficiency: float

    def as_dict(self) -> dict[str, float]:
        return {
            "step_overhead_s": self.step_overhead_s,
            "memory_efficiency": self.memory_efficiency,
            "compute_efficiency": self.compute_efficiency,
        }


def efficiencies(
    *,
    small_decode_s: float,
    big_decode_s: float,
    big_weight_bytes: float,
    big_parameters: float,
    big_s_per_token: float,
    hbm_bytes_per_s: float,
    dense_flops_per_s: float,
) -> Efficiencies | None:
    """``Efficiencies`` from the two models' fitted steps; None when the big model's step is
    not longer than the small one's (nothing to read its weights' time from)."""
    if big_decode_s <= small_decode_s or big_s_per_token <= 0:
        return None
    eta_m = big_weight_bytes / (hbm_bytes_per_s * (big_decode_s - small_decode_s))
    eta_p = 2 * big_parameters / (big_s_per_token * dense_flops_per_s)
    return Efficiencies(small_decode_s, eta_m, eta_p)


_RATE_KEYS = {
    "wake": "weight_wake_bytes_per_s_per_gpu",
    "sleep": "weight_sleep_bytes_per_s_per_gpu",
    "pinned": "pcie_pinned_bytes_per_s_per_gpu",
}


def server_toml(base: str, name: str, measured: Mapping[str, float], source: str) -> str:
    """The catalog server file ``base`` renamed ``name``, with each rate in ``measured``
    (``wake``, ``sleep``, ``pinned``: bytes/s per GPU) replacing the catalog's, a comment naming
    ``source`` above it; the other lines as they were."""
    text = re.sub(r'(?m)^name = ".*"$', f'name = "{name}"', base, count=1)
    for what, value in measured.items():
        key = _RATE_KEYS[what]
        line = f"# measured: {source}\n{key} = {value:.4e}"
        text, n = re.subn(rf"(?m)^{key} = .*$", lambda _m, line=line: line, text, count=1)
        if n == 0:
            raise ValueError(f"{key} not in the base server file")
    return text


def profile_with(profile: str, values: Mapping[str, float], source: str) -> str:
    """A ``talaria calibrate`` profile file with ``values`` (``EfficiencyProfile`` fields) put
    in its ``[profile]`` table, after its name line."""
    lines = [f"# {source}"] + [f"{k} = {v:.6e}" for k, v in values.items()]
    head, sep, rest = profile.partition("\n[profile]\n")
    if not sep:
        raise ValueError("no [profile] table")
    name_line, _, tail = rest.partition("\n")
    return head + sep + name_line + "\n" + "\n".join(lines) + "\n" + tail
