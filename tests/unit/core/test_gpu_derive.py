"""The GPU check's pure part (bench/gpu/derive.py) on known configs and made-up measurements:
what it writes must be what the formulas give, and the catalog must read it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.gpu.derive import (
    dense_config,
    efficiencies,
    fit_line,
    llama_parameters,
    profile_with,
    server_toml,
)
from talaria.core.catalog import load_catalog
from tests.support import REPO_ROOT

SMOLLM2 = {
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
    "vocab_size": 49152, "tie_word_embeddings": True,
}  # fmt: skip
LLAMA3_8B = {
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "tie_word_embeddings": False,
}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "parameters"),
    [
        # SmolLM2-135M: its safetensors hold 538,090,408 bytes of float32 = 134.5M values + header
        (SMOLLM2, 134_515_008),
        # Meta-Llama-3-8B: 8,030,261,248 parameters (its model card's safetensors total)
        (LLAMA3_8B, 8_030_261_248),
    ],
)
def test_parameters_of_known_models(config: dict[str, int], parameters: int) -> None:
    assert llama_parameters(config) == parameters


def test_a_dense_config_keeps_the_vocabulary_and_has_the_size_asked() -> None:
    config = dense_config({**SMOLLM2, "model_type": "llama"}, 4096, 32)
    assert config["vocab_size"] == 49152 and config["model_type"] == "llama"
    assert config["num_attention_heads"] == 32 and config["num_key_value_heads"] == 8
    assert 7.0e9 < llama_parameters(config) < 7.8e9


def test_the_line_recovers_a_rate_and_a_fixed_cost() -> None:
    points = [(b, 0.2 + b / 25e9) for b in (0.27e9, 2.1e9, 14.8e9) for _ in range(3)]
    line = fit_line(points)
    assert line is not None
    assert line.fixed_s == pytest.approx(0.2) and line.bytes_per_s == pytest.approx(25e9)


@pytest.mark.parametrize(
    "points",
    [
        [(1e9, 1.0), (1e9, 1.1)],  # one size: no slope
        [(1e9, 1.0), (2e9, 1.0), (4e9, 0.9)],  # not growing with size: no copy measured
    ],
)
def test_no_line_where_the_times_say_nothing_of_a_rate(points: list[tuple[float, float]]) -> None:
    assert fit_line(points) is None


def test_efficiencies_follow_the_roofline() -> None:
    # 16 GB read at 0.8 × 4.8 TB/s = 4.1667 ms beyond a 5 ms fixed step; prefill at
    # 2 × 8e9 FLOPs per token at 0.4 of 989 TFLOP/s
    s_per_token = 2 * 8e9 / (0.4 * 989e12)
    eff = efficiencies(
        small_decode_s=0.005,
        big_decode_s=0.005 + 16e9 / (0.8 * 4.8e12),
        big_weight_bytes=16e9,
        big_parameters=8e9,
        big_s_per_token=s_per_token,
        hbm_bytes_per_s=4.8e12,
        dense_flops_per_s=989e12,
    )
    assert eff is not None
    assert eff.step_overhead_s == 0.005
    assert eff.memory_efficiency == pytest.approx(0.8)
    assert eff.compute_efficiency == pytest.approx(0.4)


def test_no_efficiencies_when_the_big_model_is_not_slower() -> None:
    kwargs = dict(big_weight_bytes=1e9, big_parameters=5e8, big_s_per_token=1e-5)
    args = dict(hbm_bytes_per_s=4.8e12, dense_flops_per_s=989e12, **kwargs)
    assert efficiencies(small_decode_s=0.005, big_decode_s=0.005, **args) is None


def test_written_files_are_read_by_the_catalog(tmp_path: Path) -> None:
    base = (REPO_ROOT / "core" / "data" / "servers" / "h200x8.toml").read_text()
    measured = {"wake": 24e9, "sleep": 20e9, "pinned": 52e9}
    server = tmp_path / "server.toml"
    server.write_text(server_toml(base, "h200x8-measured", measured, "a test, 2026-12-03"))
    profile = tmp_path / "profile.toml"
    calibrated = (
        '# Measured by `talaria calibrate`.\n\n[profile]\nname = "h200-measured"\n'
        "block_tokens = 16\n"
    )
    values = {"step_overhead_s": 0.004, "memory_efficiency": 0.8, "compute_efficiency": 0.45}
    profile.write_text(profile_with(calibrated, values, "read off: a test"))
    catalog = load_catalog([server, profile])
    s = catalog.server("h200x8-measured")
    assert (s.weight_wake_bytes_per_s_per_gpu, s.weight_sleep_bytes_per_s_per_gpu) == (24e9, 20e9)
    assert s.pcie_pinned_bytes_per_s_per_gpu == 52e9
    assert s.hbm_bytes_per_gpu == catalog.server("h200x8").hbm_bytes_per_gpu
    p = catalog.profiles["h200-measured"]
    assert (p.step_overhead_s, p.memory_efficiency, p.compute_efficiency) == (0.004, 0.8, 0.45)
    assert p.block_tokens == 16
    assert "# measured: a test, 2026-12-03" in server.read_text()


def test_a_rate_the_base_file_lacks_is_an_error() -> None:
    with pytest.raises(ValueError, match="weight_wake"):
        server_toml('[server]\nname = "x"\n', "y", {"wake": 1e9}, "t")
