"""Shipped catalog data (models, servers, profiles) and the catalog loader."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from talaria.core.catalog import load_catalog
from talaria.core.catalog_error import CatalogError
from talaria.core.efficiency_profile import EfficiencyProfile
from talaria.core.model_spec import (
    BYTES_PER_PARAM,
    ModelSpec,
    kv_bytes_per_token,
    kv_bytes_per_token_tp,
)
from talaria.core.server_spec import ServerSpec

SHIPPED_MODELS = [
    "glm-4.5-fp8",
    "qwen3-235b-a22b-bf16",
    "qwen3-coder-480b-a35b-fp8",
    "gpt-oss-120b",
    "deepseek-v3-fp8",
    "llama-4-scout-bf16",
]
PAPER_TRIO = ["glm-4.5-fp8", "qwen3-235b-a22b-bf16", "qwen3-coder-480b-a35b-fp8"]

# docs/sources.md §3: KV bytes per token (logical, physical at TP=8) and fixed bytes per sequence.
SOURCED_KV = {
    "glm-4.5-fp8": (376_832, 376_832, 0),
    "qwen3-235b-a22b-bf16": (192_512, 385_024, 0),
    "qwen3-coder-480b-a35b-fp8": (253_952, 253_952, 0),
    "gpt-oss-120b": (36_864, 36_864, 4_718_592),
    "deepseek-v3-fp8": (70_272, 562_176, 0),
    "llama-4-scout-bf16": (196_608, 196_608, 0),
}

TP = 8


@pytest.fixture(autouse=True)
def _no_env_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see only the shipped data unless they set TALARIA_CATALOG_PATH themselves."""
    monkeypatch.delenv("TALARIA_CATALOG_PATH", raising=False)


def _data_files(kind: str) -> Iterator[Path]:
    shipped = resources.files("talaria.core") / "data"
    with resources.as_file(shipped) as data_dir:
        yield from sorted((Path(data_dir) / kind).glob("*.toml"))


def _model(name: str) -> ModelSpec:
    return load_catalog().model(name)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"no TOML form for {value!r}")


def _model_toml(fields: dict[str, Any]) -> str:
    lines = ["[model]", *(f"{key} = {_toml_value(value)}" for key, value in fields.items())]
    return "\n".join(lines) + "\n"


def _write_model(directory: Path, filename: str, **overrides: Any) -> Path:
    """A model file built from the shipped GLM-4.5 entry with ``overrides`` applied."""
    fields = dataclasses.asdict(_model("glm-4.5-fp8"))
    fields.update(overrides)
    path = directory / filename
    path.write_text(_model_toml(fields))
    return path


# --- shipped data -------------------------------------------------------------------------


def test_shipped_names() -> None:
    catalog = load_catalog()
    assert set(SHIPPED_MODELS) <= set(catalog.models)
    assert "h200x8" in catalog.servers
    assert "default" in catalog.profiles


@pytest.mark.parametrize(
    ("kind", "table", "cls"),
    [("models", "model", ModelSpec), ("servers", "server", ServerSpec)],
)
def test_shipped_files_list_every_field(kind: str, table: str, cls: type[Any]) -> None:
    files = list(_data_files(kind))
    assert files
    expected = {f.name for f in dataclasses.fields(cls)}
    for path in files:
        doc = tomllib.loads(path.read_text())
        assert set(doc) == {table}, path
        assert set(doc[table]) == expected, path


def test_shipped_profile_file_matches_defaults() -> None:
    files = list(_data_files("profiles"))
    assert [p.name for p in files] == ["default.toml"]
    doc = tomllib.loads(files[0].read_text())
    assert set(doc["profile"]) == {f.name for f in dataclasses.fields(EfficiencyProfile)}
    assert load_catalog().profile("default") == EfficiencyProfile()


_ASSIGNMENT = re.compile(r"^\s*(\w+)\s*=")


@pytest.mark.parametrize("kind", ["models", "servers", "profiles"])
def test_every_figure_has_a_source_comment(kind: str) -> None:
    for path in _data_files(kind):
        previous = ""
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            match = _ASSIGNMENT.match(line)
            if match and match.group(1) != "name":
                assert "#" in line or previous.lstrip().startswith("#"), f"{path}:{number}"
            if line.strip():
                previous = line


_SCALAR_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


@pytest.mark.parametrize("name", SHIPPED_MODELS)
def test_model_field_types(name: str) -> None:
    model = _model(name)
    for f in dataclasses.fields(ModelSpec):
        value = getattr(model, f.name)
        expected = _SCALAR_TYPES[str(f.type)]
        assert type(value) is expected, f"{name}.{f.name} = {value!r} is not {f.type}"


@pytest.mark.parametrize("name", SHIPPED_MODELS)
def test_kv_bytes_match_facts(name: str) -> None:
    model = _model(name)
    logical, physical, fixed = SOURCED_KV[name]
    assert model.kv_bytes_per_token == logical
    assert model.kv_bytes_per_token_tp8 == physical
    assert model.kv_fixed_bytes_per_seq_tp8 == fixed


@pytest.mark.parametrize("name", SHIPPED_MODELS)
def test_kv_bytes_match_formula(name: str) -> None:
    m = _model(name)
    if m.is_mla:
        assert m.kv_heads == 0
        latent_bytes = m.layers * (m.mla_kv_lora_rank + m.mla_rope_dim) * 2
        assert m.kv_bytes_per_token == latent_bytes
        assert m.kv_bytes_per_token_tp8 == latent_bytes * TP
        assert m.kv_fixed_bytes_per_seq_tp8 == 0
        return
    # Sliding-window layers hold a fixed window per sequence; the rest grow per token.
    window_layers = round(m.layers * m.attention_window_layer_fraction)
    full_layers = m.layers - window_layers
    assert m.kv_bytes_per_token == kv_bytes_per_token(full_layers, m.kv_heads, m.head_dim)
    assert m.kv_bytes_per_token_tp8 == kv_bytes_per_token_tp(
        full_layers, m.kv_heads, m.head_dim, TP
    )
    window_bytes = kv_bytes_per_token_tp(window_layers, m.kv_heads, m.head_dim, TP)
    assert m.kv_fixed_bytes_per_seq_tp8 == window_bytes * m.attention_window_tokens


def test_kv_replication_when_fewer_kv_heads_than_ranks() -> None:
    qwen = _model("qwen3-235b-a22b-bf16")
    assert qwen.kv_heads < TP
    assert qwen.kv_bytes_per_token_tp8 == qwen.kv_bytes_per_token * TP // qwen.kv_heads


@pytest.mark.parametrize("name", SHIPPED_MODELS)
def test_weights_consistent_with_dtype(name: str) -> None:
    m = _model(name)
    assert m.weight_dtype in BYTES_PER_PARAM
    nominal = m.total_params * BYTES_PER_PARAM[m.weight_dtype]
    # Checkpoints carry scales and bf16 norms/embeddings: within 10% of params × dtype bytes.
    assert nominal * 0.95 <= m.weight_bytes <= nominal * 1.10


@pytest.mark.parametrize("name", SHIPPED_MODELS)
def test_expert_dense_split(name: str) -> None:
    m = _model(name)
    assert m.is_moe
    assert 0 < m.experts_per_token < m.num_experts
    assert m.expert_params > 0
    assert m.dense_params > 0
    assert m.dense_params < m.active_params < m.total_params
    assert math.isclose(m.dense_params + m.expert_params, m.total_params)
    per_token = m.dense_params + m.expert_params * m.experts_per_token / m.num_experts
    assert math.isclose(per_token, m.active_params)


def test_dense_model_has_no_expert_params(tmp_path: Path) -> None:
    _write_model(tmp_path, "dense.toml", name="dense", num_experts=0, experts_per_token=0)
    dense = load_catalog([tmp_path]).model("dense")
    assert not dense.is_moe
    assert dense.expert_params == 0.0
    assert dense.dense_params == dense.total_params


@pytest.mark.parametrize(("name", "reasoning"), [(n, n == "gpt-oss-120b") for n in SHIPPED_MODELS])
def test_reasoning_flag(name: str, reasoning: bool) -> None:
    assert _model(name).reasoning is reasoning


@pytest.mark.parametrize(
    ("name", "context"),
    [
        ("glm-4.5-fp8", 131_072),
        ("qwen3-235b-a22b-bf16", 131_072),
        ("qwen3-coder-480b-a35b-fp8", 262_144),
        ("gpt-oss-120b", 131_072),
        ("deepseek-v3-fp8", 131_072),
        ("llama-4-scout-bf16", 131_072),
    ],
)
def test_context_windows(name: str, context: int) -> None:
    assert _model(name).context_window_tokens == context


def test_paper_trio_does_not_fit_together_but_each_fits_alone() -> None:
    catalog = load_catalog()
    usable = catalog.server("h200x8").usable_hbm_bytes
    weights = [catalog.model(name).weight_bytes for name in PAPER_TRIO]
    assert sum(weights) > usable
    for w in weights:
        assert w < usable


def test_h200x8_server() -> None:
    server = load_catalog().server("h200x8")
    assert server.gpus == 8
    assert math.isclose(server.hbm_bytes, 8 * 141e9)
    assert math.isclose(server.usable_hbm_bytes, 8 * 141e9 * 0.9)
    assert server.flops_per_s("bf16") == 989e12
    assert server.flops_per_s("fp8") == 1979e12
    assert server.flops_per_s("mxfp4") == server.flops_per_s("fp8")
    with pytest.raises(CatalogError, match="h200x8"):
        server.flops_per_s("fp4")
    assert server.pcie_pinned_bytes_per_s_per_gpu < server.pcie_peak_bytes_per_s_per_gpu
    assert server.pcie_peak_bytes_per_s_per_gpu < server.nvlink_bytes_per_s_per_gpu


def test_sleep_mode_rates_follow_blog_arithmetic() -> None:
    server = load_catalog().server("h200x8")
    per_gpu = 235e9 / 4  # Qwen3-235B-A22B-FP8 weights over TP=4 (docs/sources.md §4)
    wake_s = (5.3 + 5.7) / 2
    sleep_s = (5.8 + 6.0) / 2
    assert math.isclose(server.weight_wake_bytes_per_s_per_gpu, per_gpu / wake_s, rel_tol=1e-3)
    assert math.isclose(server.weight_sleep_bytes_per_s_per_gpu, per_gpu / sleep_s, rel_tol=1e-3)


# --- user directories and overrides --------------------------------------------------------


def test_user_directory_adds_a_model(tmp_path: Path) -> None:
    _write_model(tmp_path, "mine.toml", name="my-model", hf_id="me/my-model")
    catalog = load_catalog([tmp_path])
    assert catalog.model("my-model").hf_id == "me/my-model"
    assert set(SHIPPED_MODELS) < set(catalog.models)


@pytest.mark.parametrize("subfolder", [None, "models"])
def test_user_model_replaces_shipped_one(tmp_path: Path, subfolder: str | None) -> None:
    directory = tmp_path / subfolder if subfolder else tmp_path
    directory.mkdir(exist_ok=True)
    _write_model(directory, "glm.toml", context_window_tokens=32_768)
    catalog = load_catalog([tmp_path])
    assert catalog.model("glm-4.5-fp8").context_window_tokens == 32_768
    assert catalog.models.keys() == load_catalog().models.keys()


def test_single_file_path_is_loaded(tmp_path: Path) -> None:
    path = _write_model(tmp_path, "one.toml", name="one-file")
    assert "one-file" in load_catalog([path]).models


def test_user_server_and_profile(tmp_path: Path) -> None:
    (tmp_path / "fast.toml").write_text(
        '[profile]\nname = "fast"\ncompute_efficiency = 0.5\nmemory_efficiency = 0.9\n'
    )
    server = tomllib.loads((next(_data_files("servers"))).read_text())["server"]
    server["name"] = "h200x4"
    server["gpus"] = 4
    flops = ", ".join(f"{k} = {v!r}" for k, v in server.pop("dense_flops_per_s_per_gpu").items())
    body = "\n".join(f"{k} = {_toml_value(v)}" for k, v in server.items())
    (tmp_path / "h200x4.toml").write_text(
        f"[server]\n{body}\ndense_flops_per_s_per_gpu = {{ {flops} }}\n"
    )
    catalog = load_catalog([tmp_path])
    assert catalog.profile("fast") == EfficiencyProfile(
        name="fast", compute_efficiency=0.5, memory_efficiency=0.9
    )
    assert catalog.server("h200x4").gpus == 4
    assert catalog.server("h200x8").gpus == 8


def test_env_var_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    _write_model(first, "x.toml", name="env-model", layers=1)
    _write_model(second, "y.toml", name="env-model-2")
    monkeypatch.setenv("TALARIA_CATALOG_PATH", f"{first}{os.pathsep}{second}")
    catalog = load_catalog()
    assert catalog.model("env-model").layers == 1
    assert "env-model-2" in catalog.models


def test_extra_dirs_win_over_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_dir, extra_dir = tmp_path / "env", tmp_path / "extra"
    env_dir.mkdir()
    extra_dir.mkdir()
    _write_model(env_dir, "m.toml", name="both", layers=1)
    _write_model(extra_dir, "m.toml", name="both", layers=2)
    monkeypatch.setenv("TALARIA_CATALOG_PATH", str(env_dir))
    assert load_catalog([extra_dir]).model("both").layers == 2


def test_missing_env_path_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope"
    monkeypatch.setenv("TALARIA_CATALOG_PATH", str(missing))
    with pytest.raises(CatalogError, match=re.escape(str(missing))):
        load_catalog()


def test_unknown_names_raise() -> None:
    catalog = load_catalog()
    with pytest.raises(CatalogError, match=re.escape("glm-4.5-fp8")):
        catalog.model("no-such-model")
    with pytest.raises(CatalogError, match="h200x8"):
        catalog.server("no-such-server")
    with pytest.raises(CatalogError, match="default"):
        catalog.profile("no-such-profile")


# --- malformed files -----------------------------------------------------------------------


def _missing_field() -> str:
    fields = dataclasses.asdict(_model("glm-4.5-fp8"))
    del fields["layers"]
    return _model_toml(fields)


def _unknown_field() -> str:
    fields = dataclasses.asdict(_model("glm-4.5-fp8"))
    fields["layer_count"] = 92
    return _model_toml(fields)


@pytest.mark.parametrize(
    ("case", "make_text", "message"),
    [
        ("missing-field", _missing_field, "layers"),
        ("unknown-field", _unknown_field, "layer_count"),
        ("bad-toml", lambda: "[model]\nname = \n", ""),
        ("unknown-table", lambda: '[engine]\nname = "x"\n', "expected a"),
        ("empty", lambda: "", "expected a"),
    ],
)
def test_malformed_file_raises_with_path(
    tmp_path: Path, case: str, make_text: Callable[[], str], message: str
) -> None:
    path = tmp_path / f"{case}.toml"
    path.write_text(make_text())
    with pytest.raises(CatalogError) as info:
        load_catalog([tmp_path])
    assert str(path) in str(info.value)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("name", "tool_parser", "reasoning_parser"),
    [
        ("glm-4.5-fp8", "glm45", "glm45"),
        ("qwen3-235b-a22b-bf16", "hermes", "qwen3"),
        ("qwen3-coder-480b-a35b-fp8", "qwen3_coder", ""),
        ("gpt-oss-120b", "openai", "openai_gptoss"),
        ("deepseek-v3-fp8", "deepseek_v3", ""),
        ("llama-4-scout-bf16", "llama4_pythonic", ""),
        ("tiny-a", "", ""),
        ("tiny-b", "", ""),
    ],
)
def test_each_shipped_model_names_its_vllm_parsers(
    name: str, tool_parser: str, reasoning_parser: str
) -> None:
    """Each model family has its own tool-call and reasoning format (the vLLM stage checks
    that the pinned vLLM registers these names)."""
    model = _model(name)
    assert (model.tool_parser, model.reasoning_parser) == (tool_parser, reasoning_parser)


def test_placing_a_model_costs_its_weights_at_the_sources_rate_plus_the_engine_start() -> None:
    catalog = load_catalog()
    h200 = catalog.server("h200x8")
    weights = catalog.model("deepseek-v3-fp8").weight_bytes
    assert h200.placement_s(weights, from_peer=True) == pytest.approx(
        weights / h200.peer_network_bytes_per_s + h200.engine_init_s
    )
    assert h200.placement_s(weights, from_peer=False) == pytest.approx(
        weights / h200.storage_read_bytes_per_s + h200.engine_init_s
    )
    assert h200.placement_s(weights, from_peer=False) > h200.placement_s(weights, from_peer=True)
    with pytest.raises(CatalogError, match="storage_read_bytes_per_s"):
        catalog.server("cpu-vllm").placement_s(1e9, from_peer=False)


def test_a_variant_is_its_base_spec_under_its_own_name() -> None:
    catalog = load_catalog()
    assert catalog.find("gpt-oss-120b@acme") is not None
    variant = catalog.model("gpt-oss-120b@acme")
    base = catalog.model("gpt-oss-120b")
    assert variant.name == "gpt-oss-120b@acme"
    assert dataclasses.replace(variant, name=base.name) == base
    assert "gpt-oss-120b@acme" in catalog.models  # listed once named (module docstring)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nosuch@acme", "a variant of 'nosuch', which is not in the catalog"),
        ("nosuch", "unknown model 'nosuch'"),
    ],
)
def test_a_variant_of_an_unknown_base_is_one_clear_error(name: str, message: str) -> None:
    catalog = load_catalog()
    assert catalog.find(name) is None
    with pytest.raises(CatalogError, match=message):
        catalog.model(name)
    assert name not in catalog.models
