"""Roofline cost model of one model served with TP over one multi-GPU server.

Source of every formula: docs/sources.md §4 "Cost-model shape" (est.). One engine iteration
(continuous batching with chunked prefill) costs a fixed overhead plus the larger of its compute
time and its HBM-traffic time; transfers are bytes over the per-GPU link rate times the GPUs.
The server may be a GPU group (core/groups.py): TP = its ``gpus``. Byte counts are physical
bytes summed over its GPUs (KV: ``kv_bytes_per_token_at(model, gpus)``, the catalog's
``kv_bytes_per_token_tp8`` on a whole 8-GPU node).

A model whose profile carries a ``StepFit`` (measured by ``talaria calibrate``) takes its step
time from that fit instead of the roofline; transfers keep the server's rates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from talaria.core.efficiency_profile import EfficiencyProfile
from talaria.core.groups import kv_bytes_per_token_at, kv_fixed_bytes_per_seq_at
from talaria.core.model_spec import ModelSpec
from talaria.core.server_spec import ServerSpec
from talaria.core.weight_tiers import WeightTier, load_s


@dataclass(frozen=True)
class PrefillChunk:
    """``tokens`` prefilled in one step for one sequence that already holds ``context_tokens``."""

    tokens: int
    context_tokens: int


def _attended(tokens: int, context: int, window: int) -> float:
    """Attention work of a chunk, in token pairs: ∫ min(p, window) dp over [context, context +
    tokens]. Without a window (or below it) this is tokens × context + tokens² / 2."""
    lo, hi = context, context + tokens
    if hi <= window:
        return tokens * context + tokens * tokens / 2
    if lo >= window:
        return float(tokens * window)
    return (window - lo) * (window + lo) / 2 + (hi - window) * window


class CostModel:
    """Step, request and transfer times of ``model`` on ``server`` (docs/sources.md §4, est.)."""

    def __init__(self, model: ModelSpec, server: ServerSpec, profile: EfficiencyProfile) -> None:
        if profile.max_num_batched_tokens <= 0 or profile.block_tokens <= 0:
            raise ValueError("max_num_batched_tokens and block_tokens must be positive")
        self.model, self.server, self.profile = model, server, profile
        gpus = server.gpus
        mem_bw = profile.memory_efficiency * gpus * server.hbm_bytes_per_s_per_gpu
        linear_flops = profile.compute_efficiency * gpus * server.flops_per_s(model.weight_dtype)
        attn_flops = profile.compute_efficiency * gpus * server.flops_per_s("bf16")
        d_att = model.mla_kv_lora_rank + model.mla_rope_dim if model.is_mla else model.head_dim
        self._mem_bw = mem_bw
        self._linear_s_per_token = 2.0 * model.active_params / linear_flops
        self._attn_s_per_pair = 4.0 * model.layers * model.q_heads * d_att / attn_flops
        self.kv_bytes_per_token = kv_bytes_per_token_at(model, gpus)
        """Physical KV bytes per token over the server's GPUs (TP = gpus)."""
        self.kv_fixed_bytes_per_seq = kv_fixed_bytes_per_seq_at(model, gpus)
        """Physical fixed KV bytes of a sequence (sliding-window layers) over them."""
        self._kv_s_per_token = self.kv_bytes_per_token / mem_bw
        windowed = model.attention_window_tokens > 0
        self._window = model.attention_window_tokens
        self._window_frac = model.attention_window_layer_fraction if windowed else 0.0
        self._decode_consts: dict[int, tuple[float, float]] = {}
        self.fit = profile.fitted.get(model.name)
        """The measured step time of this model, if calibrated (replaces the roofline)."""

    # memory
    def kv_bytes(self, tokens: int) -> float:
        """Physical KV bytes of one sequence on the server: ceil(tokens / block_tokens) ×
        block_tokens × kv_bytes_per_token + kv_fixed_bytes_per_seq; 0 tokens → 0."""
        if tokens <= 0:
            return 0.0
        block = self.profile.block_tokens
        blocks = -(-tokens // block)
        return float(blocks * block * self.kv_bytes_per_token + self.kv_fixed_bytes_per_seq)

    def weights_touched_bytes(self, tokens_in_step: int) -> float:
        """Weight bytes read by a step of n tokens: dense_params × bpp + expert_params × bpp ×
        (1 − (1 − k/E)^n), since n tokens routed independently to k of E experts hit
        E × (1 − (1 − k/E)^n) distinct experts per layer (independence, est.). Dense: all."""
        m = self.model
        if not m.is_moe:
            return m.weight_bytes
        hit = 1.0 - (1.0 - m.experts_per_token / m.num_experts) ** tokens_in_step
        return m.bytes_per_param * (m.dense_params + m.expert_params * hit)

    # one engine iteration
    def _static_terms(self, n: int, seqs: int) -> tuple[float, float]:
        """(linear compute s, weights + fixed-KV memory s) of a step of n tokens over seqs
        sequences: 2 × active × n / (η_c × gpus × peak(weight dtype)) and (weights_touched(n) +
        seqs × kv_fixed_bytes_per_seq) / (η_m × gpus × HBM B/s)."""
        fixed = seqs * self.kv_fixed_bytes_per_seq
        return n * self._linear_s_per_token, (self.weights_touched_bytes(n) + fixed) / self._mem_bw

    def _combine(self, static: tuple[float, float], pairs: float, kv_tokens: int) -> float:
        """t_fixed + max(compute, memory): compute adds 4 × layers × q_heads × d_att × pairs /
        (η_c × gpus × peak bf16), memory adds kv_tokens × kv_bytes_per_token / (η_m ×
        gpus × HBM B/s)."""
        compute = static[0] + pairs * self._attn_s_per_pair
        memory = static[1] + kv_tokens * self._kv_s_per_token
        return self.profile.step_overhead_s + max(compute, memory)

    def _decode_pairs(self, total_context: int, seqs: int) -> float:
        """Attention pairs of decode tokens: their total context. Sliding-window models: the
        window layers (fraction f) read at most window × seqs tokens, so pairs = (1 − f) × total
        + f × min(total, window × seqs) (only the total is known: an approximation, est.)."""
        f = self._window_frac
        if f == 0.0:
            return float(total_context)
        return (1.0 - f) * total_context + f * min(total_context, self._window * seqs)

    def _chunk_pairs(self, chunk: PrefillChunk) -> float:
        """tokens × context + tokens² / 2; window layers (fraction f) see min(position, window)."""
        full = chunk.tokens * chunk.context_tokens + chunk.tokens * chunk.tokens / 2
        f = self._window_frac
        if f == 0.0:
            return full
        return (1.0 - f) * full + f * _attended(chunk.tokens, chunk.context_tokens, self._window)

    def step_time_s(
        self, prefill: Sequence[PrefillChunk], decode_contexts_total: int, decode_seqs: int
    ) -> float:
        """One iteration: step_overhead_s + max(compute_s, memory_s), or the model's
        ``StepFit`` of (n, pairs, seqs, mixed: chunks and decodes both) when calibrated; no
        tokens → 0.

        n = Σ chunk tokens + decode_seqs. compute_s = 2·active·n / (η_c·gpus·peak(weight
        dtype)) + 4·layers·q_heads·d_att·pairs / (η_c·gpus·peak bf16), pairs = decode context
        total + Σ (tokens·context + tokens²/2), d_att = head_dim, or kv_lora_rank + rope_dim for
        MLA. memory_s = (weights_touched(n) + kv_bytes_per_token·(decode context total +
        Σ (context + tokens)) + seqs·kv_fixed_bytes_per_seq) / (η_m·gpus·HBM B/s).
        Source: docs/sources.md §4 "Cost-model shape" (est.)."""
        chunks = [c for c in prefill if c.tokens > 0]
        n = sum(c.tokens for c in chunks) + decode_seqs
        if n <= 0:
            return 0.0
        pairs = self._decode_pairs(decode_contexts_total, decode_seqs)
        pairs += sum(self._chunk_pairs(c) for c in chunks)
        if self.fit is not None:
            mixed = bool(chunks) and decode_seqs > 0
            return self.fit.step_time_s(n, pairs, decode_seqs + len(chunks), mixed)
        kv_tokens = decode_contexts_total + sum(c.context_tokens + c.tokens for c in chunks)
        static = self._static_terms(n, decode_seqs + len(chunks))
        return self._combine(static, pairs, kv_tokens)

    def decode_step_time_s(self, batch: int, total_context_tokens: int) -> float:
        """Fast path of step_time_s([], total_context_tokens, batch), with the per-batch terms
        (linear compute, weights touched, fixed KV) cached. Source: docs/sources.md §4 (est.)."""
        if batch <= 0:
            return 0.0
        if self.fit is not None:
            return self.fit.step_time_s(
                batch, self._decode_pairs(total_context_tokens, batch), batch
            )
        static = self._decode_consts.get(batch)
        if static is None:
            static = self._decode_consts[batch] = self._static_terms(batch, batch)
        pairs = self._decode_pairs(total_context_tokens, batch)
        return self._combine(static, pairs, total_context_tokens)

    # whole-request estimates
    def prefill_time_s(self, new_tokens: int, cached_tokens: int) -> float:
        """new_tokens prefilled alone, in chunks of max_num_batched_tokens: Σ step_time_s(
        [PrefillChunk(chunk, cached_tokens + done)], 0, 0); 0 new tokens → 0. docs/sources.md §4."""
        size = self.profile.max_num_batched_tokens
        total, done = 0.0, 0
        while done < new_tokens:
            chunk = min(size, new_tokens - done)
            total += self.step_time_s([PrefillChunk(chunk, cached_tokens + done)], 0, 0)
            done += chunk
        return total

    def decode_time_s(self, output_tokens: int, context_tokens: int, batch: int = 1) -> float:
        """Σ_{i < output_tokens} decode_step_time_s(batch, batch × (context_tokens + i)): one
        sequence's decode among ``batch`` sequences of the same context. docs/sources.md §4
        (est.)."""
        step = self.decode_step_time_s
        return sum(step(batch, batch * (context_tokens + i)) for i in range(output_tokens))

    def new_shape_s(self) -> float:
        """Extra time of a step whose token count the engine runs for the first time: the
        fit's ``new_shape_s``; 0 for the roofline."""
        return self.fit.new_shape_s if self.fit is not None else 0.0

    def call_overhead_s(self, idle_s: float = 0.0) -> float:
        """Per-call intake latency before the first step, for a call that finds the engine
        idle for ``idle_s`` (0: busy): the fit's call_overhead_s + wake_s(idle_s); 0 for the
        roofline (its step overhead covers it)."""
        if self.fit is None:
            return 0.0
        return self.fit.call_overhead_s + self.fit.wake_s(idle_s)

    def recompute_time_s(self, tokens: int) -> float:
        """Rebuilding a lost prefix: prefill_time_s(tokens, 0)."""
        return self.prefill_time_s(tokens, 0)

    # transfers
    def kv_transfer_time_s(self, nbytes: float) -> float:
        """Host↔HBM KV over PCIe: nbytes / (gpus × pcie_pinned_bytes_per_s_per_gpu).
        docs/sources.md §4: 13.2 GB at 8 × 50 GB/s ≈ 33 ms."""
        return nbytes / (self.server.gpus * self.server.pcie_pinned_bytes_per_s_per_gpu)

    def weight_wake_time_s(self) -> float:
        """Sleep-mode wake (host → HBM): weight_bytes / gpus / weight_wake_bytes_per_s_per_gpu."""
        return self.weight_stage_time_s()

    def weight_sleep_time_s(self) -> float:
        """Sleep (HBM → host): weight_bytes / gpus / weight_sleep_bytes_per_s_per_gpu."""
        s = self.server
        return self.model.weight_bytes / s.gpus / s.weight_sleep_bytes_per_s_per_gpu

    def weight_stage_time_s(self, nbytes: float | None = None) -> float:
        """Staging weights (or ``nbytes`` of them) host → free HBM during a slot, at the
        calibrated wake rate: nbytes / gpus / weight_wake_bytes_per_s_per_gpu."""
        s = self.server
        size = self.model.weight_bytes if nbytes is None else nbytes
        return size / s.gpus / s.weight_wake_bytes_per_s_per_gpu

    def weight_read_time_s(self, tier: WeightTier, nbytes: float | None = None) -> float:
        """Weights (or ``nbytes`` of them) read into HBM from ``tier`` by an engine kept
        initialised (core/weight_tiers.py ``load_s``: nbytes ÷ the tier's rate)."""
        size = self.model.weight_bytes if nbytes is None else nbytes
        return load_s(self.server, size, tier, fresh=False)

    def d2d_switch_time_s(self) -> float:
        """Staged weights copied into place on the device: 2 (read + write) × weight_bytes /
        gpus / (hbm_bytes_per_s_per_gpu × memory_efficiency). docs/sources.md §4 (est.)."""
        s = self.server
        eff_bw = s.hbm_bytes_per_s_per_gpu * self.profile.memory_efficiency
        return 2.0 * self.model.weight_bytes / s.gpus / eff_bw
