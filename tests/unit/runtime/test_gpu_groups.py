"""GPU groups (core/groups.py): KV bytes at each TP degree, the memory minimum of each fleet
model, a group's server figures and cost model, and the errors for a bad group."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock
from talaria.core.groups import (
    GroupError,
    check_fits,
    check_group_size,
    group_floor,
    group_server,
    kv_bytes_per_token_at,
    kv_copies,
    memory_floor_bytes,
    smallest_group,
)
from talaria.runtime.config import NodeConfigError, load_node_config, parse_gpus
from talaria.runtime.costmodel import CostModel
from talaria.runtime.factory import build_node_from_config
from talaria.sim.presets import FLEET_MODELS

CATALOG = load_catalog()
H200 = CATALOG.server("h200x8")


@pytest.mark.parametrize("name", [m for m in CATALOG.models if not m.startswith("tiny")])
def test_the_catalogs_tp8_kv_is_the_group_rule_at_8(name: str) -> None:
    model = CATALOG.model(name)
    assert kv_bytes_per_token_at(model, 8) == model.kv_bytes_per_token_tp8


@pytest.mark.parametrize(
    ("name", "tp", "copies"),
    [
        ("qwen3-235b-a22b-bf16", 1, 1.0),  # 4 KV heads: no copy up to TP 4
        ("qwen3-235b-a22b-bf16", 4, 1.0),
        ("qwen3-235b-a22b-bf16", 8, 2.0),  # 8 ranks, 4 heads: each head twice
        ("deepseek-v3-fp8", 1, 1.0),  # MLA: the latent whole on every rank
        ("deepseek-v3-fp8", 4, 4.0),
        ("glm-4.5-fp8", 8, 1.0),  # 8 KV heads
    ],
)
def test_kv_copies(name: str, tp: int, copies: float) -> None:
    assert kv_copies(CATALOG.model(name), tp) == copies


def test_the_fleets_memory_minimum() -> None:
    """Weights + one full-context sequence at the group's TP within 0.9 × 141 GB per GPU:
    gpt-oss-120b one H200, GLM-4.5-Air and Llama-4-Scout two, the 235–470 GB models four (with
    Qwen3-235B bf16: its 4 KV heads need no copy at TP 4), the 480–690 GB ones eight: 77 GPUs
    (issue 40 counted 81 with every model's KV at TP 8)."""
    sizes = {m: smallest_group(CATALOG.model(m), H200) for m in FLEET_MODELS}
    assert sizes["gpt-oss-120b"] == 1
    assert {m for m, s in sizes.items() if s == 2} == {"glm-4.5-air-fp8", "llama-4-scout-bf16"}
    assert {m for m, s in sizes.items() if s == 4} == {
        "glm-4.5-fp8", "glm-4.6-fp8", "minimax-m2", "qwen3-235b-a22b-instruct-2507-fp8",
        "llama-4-maverick-fp8", "qwen3-235b-a22b-bf16",
    }  # fmt: skip
    assert sum(sizes.values()) == 77
    for name, size in sizes.items():  # the smallest: half of it does not hold the model
        model = CATALOG.model(name)
        assert memory_floor_bytes(model, size) <= size * 141e9 * 0.9
        if size > 1:
            assert memory_floor_bytes(model, size // 2) > size // 2 * 141e9 * 0.9


def test_a_group_is_the_server_with_fewer_gpus() -> None:
    four = group_server(H200, 4)
    assert (four.gpus, four.hbm_bytes_per_gpu, four.host_dram_bytes) == (4, 141e9, 1e12)
    assert four.usable_hbm_bytes == pytest.approx(4 * 141e9 * 0.9)
    assert group_server(H200, 8) is H200
    model, profile = CATALOG.model("glm-4.5-air-fp8"), CATALOG.profile("default")
    whole, half = CostModel(model, H200, profile), CostModel(model, four, profile)
    # beyond the fixed step overhead, a memory-bound decode step reads the same bytes over
    # half the GPUs' bandwidth
    fixed = profile.step_overhead_s
    assert half.decode_step_time_s(64, 64 * 4096) - fixed == pytest.approx(
        2 * (whole.decode_step_time_s(64, 64 * 4096) - fixed)
    )
    assert half.kv_transfer_time_s(1e9) == pytest.approx(2 * whole.kv_transfer_time_s(1e9))


@pytest.mark.parametrize(
    ("server", "size", "message"),
    [("h200x8", 3, "1, 2, 4 or 8 GPUs, not 3"), ("h200x8", 0, "not 0"),
     ("h200x8", 16, "not 16"), ("cpu-vllm", 2, "a group of 2 GPUs exceeds server cpu-vllm's 1")],
)  # fmt: skip
def test_a_bad_group_size_is_one_clear_error(server: str, size: int, message: str) -> None:
    with pytest.raises(GroupError, match=message):
        check_group_size(size, CATALOG.server(server))


def test_a_model_that_does_not_fit_its_group_names_the_numbers() -> None:
    with pytest.raises(GroupError) as small:
        check_fits(CATALOG.model("deepseek-v3-fp8"), H200, 4)
    text = str(small.value)
    assert "deepseek-v3-fp8" in text and "group of 4 GPUs" in text and "508 GB" in text
    assert "smallest group is 8" in text
    with pytest.raises(GroupError, match=r"kimi-k2-instruct needs 1,.* but 8 GPUs"):
        smallest_group(CATALOG.model("kimi-k2-instruct"), H200)


NODE = """
[node]
name = "g"
{gpus}

[[model]]
name = "{model}"
engine = "{engine}"
{extra}
"""


def _node(tmp_path: Path, model: str, gpus: str = "", engine: str = "sim", extra: str = "") -> Any:
    path = tmp_path / "node.toml"
    path.write_text(NODE.format(gpus=gpus, model=model, engine=engine, extra=extra))
    return load_node_config(path)


@pytest.mark.parametrize(
    ("value", "ids"),
    [("0-3", (0, 1, 2, 3)), ("4,5", (4, 5)), ("0-1,6", (0, 1, 6)), ([7], (7,)), ("2", (2,))],
)
def test_gpus_are_parsed_as_device_ids(value: Any, ids: tuple[int, ...]) -> None:
    assert parse_gpus(value, "here") == ids


@pytest.mark.parametrize("value", ["", "a-b", "3-", [1.5], "1,1", "-1", True, 4])
def test_bad_gpus_are_refused_naming_where(value: Any) -> None:
    with pytest.raises(NodeConfigError, match="here"):
        parse_gpus(value, "here")


def test_a_node_on_a_group_has_the_groups_memory(tmp_path: Path) -> None:
    config = _node(tmp_path, "gpt-oss-120b", gpus='gpus = "6"')
    assert config.gpus == (6,)
    built = build_node_from_config(config, CATALOG, LoopClock())
    assert built.node.memory.hbm_capacity_bytes == pytest.approx(141e9 * 0.9)
    whole = build_node_from_config(_node(tmp_path, "gpt-oss-120b"), CATALOG, LoopClock())
    assert whole.node.memory.hbm_capacity_bytes == pytest.approx(8 * 141e9 * 0.9)
    with pytest.raises(NodeConfigError, match=r"glm-4\.5-fp8 does not fit a group of 2 GPUs"):
        build_node_from_config(_node(tmp_path, "glm-4.5-fp8", 'gpus = "0-1"'), CATALOG, LoopClock())


def test_vllm_engines_on_a_group_run_with_its_tensor_parallelism(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import talaria.runtime.engines.vllm as vllm_engines

    asked: list[dict[str, Any]] = []

    def fake_build(*args: Any, **options: Any) -> Any:
        asked.append(options)
        raise RuntimeError("not built here")

    monkeypatch.setattr(vllm_engines, "build_vllm_engine", fake_build)
    (tmp_path / "m").mkdir()
    config = _node(tmp_path, "m", 'gpus = "0-3"', "vllm", 'path = "m"')
    with pytest.raises(RuntimeError, match="not built here"):
        build_node_from_config(config, CATALOG, LoopClock())
    assert asked[-1]["tensor_parallel_size"] == 4
    config = _node(tmp_path, "m", 'gpus = "0-3"', "vllm", 'path = "m"\ntensor_parallel_size = 2')
    with pytest.raises(NodeConfigError, match="tensor_parallel_size 2 on node g's group of 4"):
        build_node_from_config(config, CATALOG, LoopClock())
    config = _node(tmp_path, "m", "", "vllm", 'path = "m"')
    with pytest.raises(RuntimeError, match="not built here"):
        build_node_from_config(config, CATALOG, LoopClock())
    assert "tensor_parallel_size" not in asked[-1]  # no group: vLLM's own default


def test_group_floor_by_names() -> None:
    """What the proxy's placement loop asks of the catalog (proxy/edge/services.py)."""
    assert group_floor(CATALOG, "glm-4.5-fp8", "h200x8") == 4
    assert group_floor(CATALOG, "kimi-k2-instruct", "h200x8") == 9  # not even 8 hold it
    assert group_floor(CATALOG, "someone-elses-model", "h200x8") is None
    assert group_floor(CATALOG, "glm-4.5-fp8", "a-server-of-theirs") is None
