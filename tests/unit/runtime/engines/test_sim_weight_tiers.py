"""Weights woken from the tier that holds them (core/weight_tiers.py, runtime/engines/sim.py):
a pinned host copy at the sleep-mode wake rate, else the node's NVMe; a model on NVMe sleeps at
level 2 (nothing copied) unless its demand earns it a host copy."""

from __future__ import annotations

from dataclasses import replace

import pytest

from talaria.core.catalog import load_catalog
from talaria.core.catalog_error import CatalogError
from talaria.core.clock import LoopClock, run_virtual
from talaria.core.groups import group_server
from talaria.core.weight_tiers import WeightTier, fastest, load_s
from talaria.runtime.costmodel import CostModel
from talaria.runtime.engines.sim import SimEngine
from talaria.runtime.memory.host_weights import HostWeights
from talaria.runtime.memory.resources import NodeMemory, PcieLink

CATALOG = load_catalog()
SERVER = CATALOG.server("h200x8")
MODEL = CATALOG.model("glm-4.5-fp8")


@pytest.mark.parametrize(
    ("tier", "fresh", "rate"),
    [
        (WeightTier.HOST, False, 8 * SERVER.weight_wake_bytes_per_s_per_gpu),
        (WeightTier.NVME, False, SERVER.nvme_read_bytes_per_s),
        (WeightTier.PEER, False, SERVER.peer_network_bytes_per_s),
        (WeightTier.STORAGE, True, SERVER.storage_read_bytes_per_s),
    ],
)
def test_a_load_is_the_weights_over_the_tier_rate_plus_a_fresh_start(
    tier: WeightTier, fresh: bool, rate: float
) -> None:
    start = SERVER.engine_init_s if fresh else 0.0
    assert load_s(SERVER, 100e9, tier, fresh) == pytest.approx(100e9 / rate + start)
    assert load_s(SERVER, 100e9, WeightTier.HBM, fresh=False) == 0.0
    assert fastest([WeightTier.STORAGE, WeightTier.NVME, WeightTier.PEER]) is WeightTier.NVME
    # the storage tier of a fresh start is what placement has always charged
    assert load_s(SERVER, 100e9, WeightTier.STORAGE, True) == SERVER.placement_s(100e9, False)


def _cycle(has_copy: bool, calls: int, host_free: float) -> tuple[float, float, dict[str, int]]:
    """Wake the model, (observe ``calls`` of it), put it to sleep: the wake's and the sleep's
    seconds, and its loads by tier."""
    clock = LoopClock()
    memory = NodeMemory(SERVER.usable_hbm_bytes, host_free)
    memory.host_weights = HostWeights(10e12)
    memory.host_weights.start({} if not has_copy else {MODEL.name: MODEL.weight_bytes})
    if not has_copy:
        memory.host_weights.on_nvme[MODEL.name] = MODEL.weight_bytes
    engine = SimEngine(
        MODEL, CostModel(MODEL, SERVER, CATALOG.profile("default")), memory,
        PcieLink(clock), clock, "node0", host_kv=True,
    )  # fmt: skip

    async def main() -> tuple[float, float]:
        woke = await engine.activate()
        for _ in range(calls):
            memory.host_weights.observe(MODEL.name, clock.now())
        slept = await engine.deactivate(keep_kv_on_host=True, keep_host_weight_copy=True)
        return woke, slept

    woke, slept = run_virtual(main())
    return woke, slept, engine.loads


def test_a_host_copy_wakes_at_the_wake_rate_and_nvme_at_the_loaders() -> None:
    woke, slept, loads = _cycle(has_copy=True, calls=0, host_free=0.0)
    assert woke == pytest.approx(MODEL.weight_bytes / 8 / SERVER.weight_wake_bytes_per_s_per_gpu)
    assert (slept, loads) == (0.0, {"host": 1})  # the pinned copy is kept: nothing to copy
    woke, slept, loads = _cycle(has_copy=False, calls=0, host_free=0.0)
    assert woke == pytest.approx(MODEL.weight_bytes / SERVER.nvme_read_bytes_per_s)
    assert (slept, loads) == (0.0, {"nvme": 1})  # sleep level 2: the weights are discarded


def test_a_model_on_nvme_with_demand_and_room_gets_a_copy_at_its_sleep() -> None:
    room = 2 * MODEL.weight_bytes
    _, slept, _ = _cycle(has_copy=False, calls=3, host_free=room)
    assert slept == pytest.approx(MODEL.weight_bytes / 8 / SERVER.weight_sleep_bytes_per_s_per_gpu)


def test_a_group_reads_its_share_of_the_nodes_nvme() -> None:
    half = group_server(SERVER, 4)
    assert half.nvme_read_bytes_per_s == SERVER.nvme_read_bytes_per_s / 2
    assert half.nvme_bytes == SERVER.nvme_bytes / 2
    unknown = replace(SERVER, nvme_read_bytes_per_s=0.0)
    with pytest.raises(CatalogError, match="no rate for weights from nvme"):
        load_s(unknown, 1.0, WeightTier.NVME, fresh=False)
