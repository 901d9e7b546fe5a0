"""HBM / host KV accounting and the shared PCIe link."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from talaria.core.clock import LoopClock, run_virtual
from talaria.runtime.memory.resources import (
    CapacityError,
    KvLocation,
    NodeMemory,
    PcieLink,
    SessionKv,
)


def _kv(sid: str, nbytes: float, where: KvLocation = KvLocation.HBM, t: float = 0.0) -> SessionKv:
    return SessionKv(sid, "m", 100, nbytes, where, t)


def test_totals_follow_weights_staging_and_kv() -> None:
    mem = NodeMemory(hbm_capacity_bytes=100.0, host_kv_capacity_bytes=50.0)
    mem.load_weights("m", 40.0)
    mem.stage("n", 30.0)
    mem.put(_kv("s1", 10.0))
    mem.put(_kv("s2", 5.0, KvLocation.HOST))
    assert mem.hbm_used_bytes == 80.0
    assert mem.hbm_free_bytes() == 20.0
    assert mem.host_free_bytes() == 45.0
    mem.move("s1", KvLocation.HOST)
    assert (mem.hbm_kv_bytes, mem.host_kv_bytes) == (0.0, 15.0)
    mem.resize("s2", 200, 8.0)
    assert mem.host_kv_bytes == 18.0
    assert mem.drop("s2") is not None and mem.host_kv_bytes == 10.0
    mem.load_weights("n", 30.0)  # activating a staged model moves it from staged to weights
    assert mem.staged == {} and mem.hbm_used_bytes == 70.0


def test_put_replaces_an_entry_without_double_counting() -> None:
    mem = NodeMemory(100.0, 100.0)
    mem.put(_kv("s", 30.0))
    mem.put(_kv("s", 40.0))
    assert mem.hbm_kv_bytes == 40.0


@pytest.mark.parametrize(
    ("action", "tier"),
    [
        (lambda m: m.put(_kv("big", 61.0)), "HBM"),
        (lambda m: m.stage("x", 61.0), "HBM"),
        (lambda m: m.put(_kv("h", 11.0, KvLocation.HOST)), "host"),
    ],
)
def test_over_capacity_raises(action, tier: str) -> None:  # type: ignore[no-untyped-def]
    mem = NodeMemory(100.0, 10.0)
    mem.load_weights("m", 40.0)
    with pytest.raises(CapacityError, match=tier):
        action(mem)


def test_eviction_takes_the_lowest_class_first_then_the_least_recently_used() -> None:
    mem = NodeMemory(1000.0, 1000.0)
    mem.put(replace(_kv("ide-old", 1.0, t=1.0), rank=0))
    mem.put(replace(_kv("batch-new", 1.0, t=9.0), rank=2))
    mem.put(_kv("standard", 1.0, t=5.0))
    mem.put(replace(_kv("batch-old", 1.0, t=2.0), rank=2))
    order = [e.session_key for e in mem.evictable(KvLocation.HBM)]
    assert order == ["batch-old", "batch-new", "standard", "ide-old"]


def test_eviction_skips_pinned_and_other_tiers_and_orders_by_last_use() -> None:
    mem = NodeMemory(1000.0, 1000.0)
    mem.put(_kv("old", 1.0, t=1.0))
    mem.put(_kv("new", 1.0, t=5.0))
    mem.put(_kv("mid", 1.0, t=3.0))
    mem.put(_kv("host", 1.0, KvLocation.HOST, t=0.0))
    mem.kv["mid"].pins = 1
    assert [e.session_key for e in mem.evictable(KvLocation.HBM)] == ["old", "new"]
    assert [e.session_key for e in mem.evictable(KvLocation.HOST)] == ["host"]


def test_peak_is_tracked() -> None:
    mem = NodeMemory(100.0, 0.0)
    mem.put(_kv("a", 70.0))
    mem.drop("a")
    mem.put(_kv("b", 20.0))
    assert mem.peak_hbm_bytes == 70.0


def test_pcie_serialises_transfers_and_serves_lower_priority_last() -> None:
    clock = LoopClock()
    link = PcieLink(clock)
    done: list[tuple[str, float]] = []

    async def transfer(name: str, seconds: float, priority: int, delay: float) -> None:
        await clock.sleep(delay)
        await link.transfer(seconds, 1.0, priority)
        done.append((name, clock.now()))

    async def main() -> None:
        await asyncio.gather(
            transfer("first", 2.0, 1, 0.0),
            transfer("staging", 1.0, 1, 0.5),
            transfer("kv", 1.0, 0, 1.0),
        )

    run_virtual(main())
    # "kv" arrived after "staging" but has the higher priority, so it goes first.
    assert done == [("first", 2.0), ("kv", 3.0), ("staging", 4.0)]
    assert link.busy_s == 4.0 and link.bytes_moved == 3.0


def test_pcie_cancelled_waiter_does_not_block_the_link() -> None:
    clock = LoopClock()
    link = PcieLink(clock)

    async def main() -> float:
        first = asyncio.create_task(link.transfer(1.0, 1.0))
        await asyncio.sleep(0)
        waiter = asyncio.create_task(link.transfer(1.0, 1.0, priority=1))
        await asyncio.sleep(0)
        waiter.cancel()
        await first
        await link.transfer(1.0, 1.0)
        return clock.now()

    assert run_virtual(main()) == 2.0
