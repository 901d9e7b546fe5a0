"""Cost model (runtime/costmodel.py) against hand-computed roofline numbers (docs/sources.md §4).

Specs are built by hand (not from the shipped TOML) so the arithmetic below is self-contained.
Default profile: η_c = 0.3, η_m = 0.7, t_fixed = 5 ms, 8192-token chunks, 16-token blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from talaria.core.efficiency_profile import EfficiencyProfile
from talaria.core.model_spec import ModelSpec
from talaria.core.server_spec import ServerSpec
from talaria.runtime.costmodel import CostModel, PrefillChunk, _attended

GLM = ModelSpec(
    name="glm-like",
    hf_id="test/glm-like",
    total_params=355e9,
    active_params=32e9,
    layers=92,
    q_heads=96,
    kv_heads=8,
    head_dim=128,
    weight_dtype="fp8",
    weight_bytes=355e9,
    kv_bytes_per_token=376_832,  # 2 × 92 layers × 8 heads × 128 × 2 bytes: no copy at TP 8
    kv_bytes_per_token_tp8=376_832,
    context_window_tokens=131_072,
    num_experts=160,
    experts_per_token=8,
)
DENSE = ModelSpec(
    name="dense-like",
    hf_id="test/dense-like",
    total_params=70e9,
    active_params=70e9,
    layers=80,
    q_heads=64,
    kv_heads=8,
    head_dim=128,
    weight_dtype="bf16",
    weight_bytes=140e9,
    kv_bytes_per_token=327_680,
    kv_bytes_per_token_tp8=327_680,
    context_window_tokens=131_072,
)
DSV3 = ModelSpec(
    name="mla-like",
    hf_id="test/mla-like",
    total_params=671e9,
    active_params=37e9,
    layers=61,
    q_heads=128,
    kv_heads=1,
    head_dim=128,
    weight_dtype="fp8",
    weight_bytes=690e9,
    kv_bytes_per_token=70_272,
    kv_bytes_per_token_tp8=562_176,
    context_window_tokens=131_072,
    num_experts=256,
    experts_per_token=8,
    mla_kv_lora_rank=512,
    mla_rope_dim=64,
)
OSS = ModelSpec(
    name="window-like",
    hf_id="test/window-like",
    total_params=117e9,
    active_params=5.1e9,
    layers=36,
    q_heads=64,
    kv_heads=8,
    head_dim=64,
    weight_dtype="mxfp4",
    weight_bytes=65e9,
    kv_bytes_per_token=36_864,
    kv_bytes_per_token_tp8=36_864,
    context_window_tokens=131_072,
    num_experts=128,
    experts_per_token=4,
    kv_fixed_bytes_per_seq_tp8=4_718_592,
    attention_window_tokens=128,
    attention_window_layer_fraction=0.5,
)
H200X8 = ServerSpec(
    name="h200x8-like",
    gpus=8,
    hbm_bytes_per_gpu=141e9,
    hbm_bytes_per_s_per_gpu=4.8e12,
    dense_flops_per_s_per_gpu={"bf16": 989e12, "fp8": 1979e12},
    pcie_peak_bytes_per_s_per_gpu=64e9,
    pcie_pinned_bytes_per_s_per_gpu=50e9,
    nvlink_bytes_per_s_per_gpu=450e9,
    host_dram_bytes=2e12,
    weight_wake_bytes_per_s_per_gpu=10.7e9,
    weight_sleep_bytes_per_s_per_gpu=10.0e9,
)
PROFILE = EfficiencyProfile()

MEM_BW = 0.7 * 8 * 4.8e12  # η_m × gpus × HBM B/s
FP8_FLOPS = 0.3 * 8 * 1979e12  # η_c × gpus × peak fp8 (linear layers of fp8 / mxfp4 models)
BF16_FLOPS = 0.3 * 8 * 989e12  # η_c × gpus × peak bf16 (attention)
GLM_EXPERTS = (355e9 - 32e9) * 160 / (160 - 8)  # = 340e9 expert params; dense = 15e9
GLM_ATTN = 4 * 92 * 96 * 128  # FLOPs per (query, key) pair over all layers


def cm(model: ModelSpec = GLM) -> CostModel:
    return CostModel(model, H200X8, PROFILE)


@pytest.mark.parametrize(
    ("batch", "total_context", "expected_memory_s", "expected_compute_s"),
    [
        (
            1,
            35_000,
            (15e9 + 340e9 * (1 - (1 - 8 / 160) ** 1) + 376_832 * 35_000) / MEM_BW,
            2 * 32e9 * 1 / FP8_FLOPS + GLM_ATTN * 35_000 / BF16_FLOPS,
        ),
        (
            20,
            20 * 35_000,
            (15e9 + 340e9 * (1 - (1 - 8 / 160) ** 20) + 376_832 * 20 * 35_000) / MEM_BW,
            2 * 32e9 * 20 / FP8_FLOPS + GLM_ATTN * 20 * 35_000 / BF16_FLOPS,
        ),
    ],
)
def test_glm_decode_step_is_memory_bound(
    batch: int, total_context: int, expected_memory_s: float, expected_compute_s: float
) -> None:
    assert expected_compute_s < expected_memory_s
    expected = 0.005 + expected_memory_s
    assert cm().decode_step_time_s(batch, total_context) == pytest.approx(expected, rel=1e-9)
    assert cm().step_time_s([], total_context, batch) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    ("model", "chunk", "decode_total", "decode_seqs", "expected_compute_s"),
    [
        (  # GLM: one full 8192-token chunk from scratch
            GLM,
            PrefillChunk(8192, 0),
            0,
            0,
            2 * 32e9 * 8192 / FP8_FLOPS + GLM_ATTN * (8192**2 / 2) / BF16_FLOPS,
        ),
        (  # GLM: a 2048-token chunk at 10k context batched with 20 decodes of 35k
            GLM,
            PrefillChunk(2048, 10_000),
            20 * 35_000,
            20,
            2 * 32e9 * (2048 + 20) / FP8_FLOPS
            + GLM_ATTN * (20 * 35_000 + 2048 * 10_000 + 2048**2 / 2) / BF16_FLOPS,
        ),
        (  # MLA: d_att = kv_lora_rank + rope_dim = 512 + 64 instead of head_dim
            DSV3,
            PrefillChunk(8192, 0),
            0,
            0,
            2 * 37e9 * 8192 / FP8_FLOPS + 4 * 61 * 128 * (512 + 64) * (8192**2 / 2) / BF16_FLOPS,
        ),
        (  # sliding window: half the layers see min(position, 128); mxfp4 runs on fp8 peak
            OSS,
            PrefillChunk(8192, 0),
            0,
            0,
            2 * 5.1e9 * 8192 / FP8_FLOPS
            + 4
            * 36
            * 64
            * 64
            * (0.5 * 8192**2 / 2 + 0.5 * (128**2 / 2 + (8192 - 128) * 128))
            / BF16_FLOPS,
        ),
    ],
)
def test_large_prefill_step_is_compute_bound(
    model: ModelSpec,
    chunk: PrefillChunk,
    decode_total: int,
    decode_seqs: int,
    expected_compute_s: float,
) -> None:
    # memory upper bound: every weight plus all KV read, fixed bytes for every sequence
    kv_tokens = decode_total + chunk.context_tokens + chunk.tokens
    fixed = (decode_seqs + 1) * model.kv_fixed_bytes_per_seq_tp8
    memory_bound = (model.weight_bytes + model.kv_bytes_per_token_tp8 * kv_tokens + fixed) / MEM_BW
    assert memory_bound < expected_compute_s
    got = cm(model).step_time_s([chunk], decode_total, decode_seqs)
    assert got == pytest.approx(0.005 + expected_compute_s, rel=1e-9)


@pytest.mark.parametrize(
    ("tokens", "context", "window", "expected"),
    [
        (100, 0, 128, 100 * 0 + 100**2 / 2),  # all below the window
        (100, 200, 128, 100 * 128),  # all past it
        (100, 50, 128, (128**2 - 50**2) / 2 + (150 - 128) * 128),  # straddles it
    ],
)
def test_windowed_attention_pairs(tokens: int, context: int, window: int, expected: float) -> None:
    assert _attended(tokens, context, window) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, 15e9),  # dense part only
        (1, 15e9 + 340e9 * 8 / 160),  # = 32e9 = active params × 1 byte
        (20, 15e9 + 340e9 * (1 - (152 / 160) ** 20)),
        (1_000, 15e9 + 340e9 * (1 - (152 / 160) ** 1_000)),
        (100_000, 355e9),  # saturated: every expert touched
    ],
)
def test_moe_weights_touched(n: int, expected: float) -> None:
    assert cm().weights_touched_bytes(n) == pytest.approx(expected, rel=1e-9)


def test_moe_weights_touched_grows_and_saturates() -> None:
    values = [cm().weights_touched_bytes(n) for n in (1, 2, 8, 64, 512, 8192)]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert values[-1] <= 355e9
    assert values[-1] == pytest.approx(355e9, rel=1e-9)


@pytest.mark.parametrize("n", [1, 16, 8192])
def test_dense_model_touches_all_weights(n: int) -> None:
    assert cm(DENSE).weights_touched_bytes(n) == 140e9


@pytest.mark.parametrize(
    ("model", "tokens", "expected"),
    [
        (GLM, 0, 0.0),
        (GLM, 1, 16 * 376_832),
        (GLM, 16, 16 * 376_832),
        (GLM, 17, 32 * 376_832),
        (GLM, 35_000, 2188 * 16 * 376_832),  # 35000 / 16 = 2187.5 -> 2188 blocks
        (OSS, 100, 7 * 16 * 36_864 + 4_718_592),  # 100 / 16 -> 7 blocks, plus window KV
    ],
)
def test_kv_bytes_rounds_to_blocks(model: ModelSpec, tokens: int, expected: float) -> None:
    assert cm(model).kv_bytes(tokens) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        (lambda c: c.kv_transfer_time_s(13.2e9), 13.2e9 / (8 * 50e9)),  # ≈ 33 ms
        (lambda c: c.weight_wake_time_s(), 355e9 / 8 / 10.7e9),
        (lambda c: c.weight_sleep_time_s(), 355e9 / 8 / 10.0e9),
        (lambda c: c.weight_stage_time_s(), 355e9 / 8 / 10.7e9),
        (lambda c: c.weight_stage_time_s(100e9), 100e9 / 8 / 10.7e9),
        (lambda c: c.d2d_switch_time_s(), 2 * 355e9 / 8 / (4.8e12 * 0.7)),
    ],
)
def test_transfers(method: Callable[[CostModel], float], expected: float) -> None:
    assert method(cm()) == pytest.approx(expected, rel=1e-9)


def test_kv_transfer_of_35k_glm_session_is_about_33_ms() -> None:
    assert cm().kv_transfer_time_s(13.2e9) == pytest.approx(0.033, rel=1e-9)


def test_prefill_35k_from_scratch_matches_facts_order() -> None:
    # chunks 4 × 8192 + 2232, all compute bound (the 2232-token one: 30 ms linear alone, vs
    # (355e9 + 376832 × 35000) / MEM_BW = 18 ms memory); Σ (t·c + t²/2) over chunks = 35000² / 2
    expected = 5 * 0.005 + 2 * 32e9 * 35_000 / FP8_FLOPS + GLM_ATTN * (35_000**2 / 2) / BF16_FLOPS
    got = cm().prefill_time_s(35_000, 0)
    assert 0.5 < got < 3.0
    assert got == pytest.approx(expected, rel=1e-9)
    assert cm().recompute_time_s(35_000) == got


@pytest.mark.parametrize("cached", [0, 10_000, 30_000, 60_000])
def test_prefill_cost_grows_with_cached_prefix(cached: int) -> None:
    model = cm()
    assert model.prefill_time_s(8192, cached + 5_000) > model.prefill_time_s(8192, cached)


@pytest.mark.parametrize(
    ("model", "batch"), [(GLM, 1), (GLM, 4), (DENSE, 1), (OSS, 1), (OSS, 8), (DSV3, 2)]
)
def test_decode_time_is_sum_of_steps(model: ModelSpec, batch: int) -> None:
    c = cm(model)
    explicit = sum(c.step_time_s([], batch * (35_000 + i), batch) for i in range(150))
    assert c.decode_time_s(150, 35_000, batch) == pytest.approx(explicit, rel=1e-9)


def test_glm_decode_time_batch_1_by_hand() -> None:
    # Σ_{i<150} 5 ms + (32e9 + 376832 × (35000 + i)) / MEM_BW, Σ i = 149 × 150 / 2
    expected = 150 * 0.005 + (150 * 32e9 + 376_832 * (150 * 35_000 + 149 * 150 / 2)) / MEM_BW
    assert cm().decode_time_s(150, 35_000) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("model", [GLM, DENSE, OSS, DSV3])
@pytest.mark.parametrize(("batch", "total"), [(1, 100), (1, 35_000), (20, 700_000), (64, 64)])
def test_decode_fast_path_matches_step_time(model: ModelSpec, batch: int, total: int) -> None:
    c = cm(model)
    assert c.decode_step_time_s(batch, total) == c.step_time_s([], total, batch)
    assert c.decode_step_time_s(batch, total) == c.step_time_s([], total, batch)  # cached


def test_zero_work_costs_nothing() -> None:
    c = cm()
    assert c.step_time_s([], 0, 0) == 0.0
    assert c.step_time_s([PrefillChunk(0, 5_000)], 0, 0) == 0.0
    assert c.decode_step_time_s(0, 0) == 0.0
    assert c.prefill_time_s(0, 5_000) == 0.0
    assert c.decode_time_s(0, 5_000) == 0.0
    assert c.kv_bytes(0) == 0.0
