"""Which models keep pinned host weight copies (runtime/memory/host_weights.py), and the node's
memory laid out with them (runtime/memory/sizing.py ``node_memory``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talaria.core.catalog import load_catalog
from talaria.runtime.memory.host_weights import DEMAND_HALF_LIFE_S, HostWeights
from talaria.runtime.memory.resources import NodeMemory
from talaria.runtime.memory.sizing import (
    HOST_RESERVE_FRACTION,
    node_memory,
    pinned_weight_budget_bytes,
)


def _weights(budget: float, **sizes: float) -> HostWeights:
    weights = HostWeights(budget)
    weights.start(sizes)
    return weights


def test_copies_go_in_order_while_the_budget_lasts() -> None:
    weights = _weights(100.0, a=40.0, b=50.0, c=20.0, d=10.0)
    assert weights.held == {"a": 40.0, "b": 50.0, "d": 10.0}
    assert weights.on_nvme == {"c": 20.0}
    assert [weights.has_copy(m) for m in "abcd"] == [True, True, False, True]
    assert weights.has_copy("placed-later")  # its placement checked the budget


def test_expected_demand_halves_every_half_life() -> None:
    weights = HostWeights()
    for t in (0.0, 0.0):
        weights.observe("a", t)
    assert weights.expected("a", 0.0) == 2.0
    assert weights.expected("a", DEMAND_HALF_LIFE_S) == pytest.approx(1.0)
    assert weights.expected("never", 5.0) == 0.0


@pytest.mark.parametrize(
    ("calls", "budget", "free", "held", "change"),
    [
        # c (on NVMe, 3 calls) is busier than b (1): b's copy is dropped for c's
        ({"a": 5, "b": 1, "c": 3}, 100.0, 0.0, {"a", "c"}, 30.0),
        # c is the least wanted: it stays on NVMe
        ({"a": 5, "b": 4, "c": 1}, 100.0, 100.0, {"a", "b"}, None),
        # the budget has room, the host KV tier's free bytes do not, and no copy is wanted less
        ({"a": 9, "b": 9, "c": 5}, 200.0, 10.0, {"a", "b"}, None),
        # both have room: nothing is dropped, the tier gives c's bytes
        ({"a": 9, "b": 9, "c": 5}, 200.0, 30.0, {"a", "b", "c"}, -20.0),
    ],
)
def test_a_copy_is_kept_for_the_model_with_more_expected_demand(
    calls: dict[str, int], budget: float, free: float, held: set[str], change: float | None
) -> None:
    weights = HostWeights(budget)
    weights.start({"a": 40.0, "b": 50.0})
    weights.on_nvme["c"] = 20.0
    for model, n in calls.items():
        for _ in range(n):
            weights.observe(model, 0.0)
    assert weights.keep("c", 0.0, free) == change
    assert set(weights.held) == held
    assert weights.has_copy("c") is ("c" in held)
    assert sum(weights.held.values()) <= weights.budget_bytes


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 60), min_size=1, max_size=8),
    events=st.lists(st.tuples(st.integers(0, 7), st.booleans()), max_size=60),
    budget=st.integers(0, 150),
    host_kv=st.integers(0, 200),
)
def test_copies_never_pass_the_budget_nor_the_host_tier(
    sizes: list[int], events: list[tuple[int, bool]], budget: int, host_kv: int
) -> None:
    memory = NodeMemory(1e12, float(host_kv))
    memory.host_weights = HostWeights(float(budget))
    models = {f"m{i}": float(s) for i, s in enumerate(sizes)}
    memory.resize_host_kv(-memory.host_weights.start(models))
    for t, (i, is_call) in enumerate(events):
        model = f"m{i % len(sizes)}"
        if is_call:
            memory.host_weights.observe(model, float(t))
        elif not memory.host_weights.has_copy(model):
            memory.keep_host_copy(model, float(t))
        held = memory.host_weights.held
        assert sum(held.values()) <= budget
        assert set(held) | set(memory.host_weights.on_nvme) == set(models)
        assert not set(held) & set(memory.host_weights.on_nvme)
        assert memory.host_kv_bytes <= memory.host_kv_capacity_bytes


def test_a_node_whose_models_fit_keeps_them_all_and_a_market_node_keeps_its_floor() -> None:
    catalog = load_catalog()
    server = catalog.server("h200x8")
    room = server.host_dram_bytes * (1 - HOST_RESERVE_FRACTION)
    paper = [catalog.model(m) for m in ("glm-4.5-fp8", "qwen3-235b-a22b-instruct-2507-fp8")]
    memory = node_memory(server, paper)
    assert memory.host_weights.on_nvme == {}
    assert memory.host_kv_capacity_bytes == room - sum(m.weight_bytes for m in paper)
    names = [
        "deepseek-v3-fp8",
        "kimi-k2-instruct",
        "glm-4.5-fp8",
        "qwen3-235b-a22b-instruct-2507-fp8",
    ]
    market = [catalog.model(m) for m in names]
    memory = node_memory(server, market)
    held = sum(memory.host_weights.held.values())
    assert memory.host_weights.on_nvme  # over the budget: some wake from NVMe
    assert held <= pinned_weight_budget_bytes(server)
    assert memory.host_kv_capacity_bytes == room - held
    no_nvme = replace(server, nvme_read_bytes_per_s=0.0)
    assert node_memory(no_nvme, market).host_weights.on_nvme == {}  # as before the tiers
