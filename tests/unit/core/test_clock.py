"""The virtual-time loop and the loop clock."""

from __future__ import annotations

import asyncio
import time

import pytest

from talaria.core.clock import LoopClock, VirtualTimeDeadlock, VirtualTimeLoop, run_virtual


def test_virtual_time_jumps_to_next_timer_without_waiting() -> None:
    clock = LoopClock()

    async def main() -> list[float]:
        seen = []
        for dt in (5.0, 3600.0, 0.25):
            await clock.sleep(dt)
            seen.append(clock.now())
        return seen

    started = time.perf_counter()
    assert run_virtual(main()) == [5.0, 3605.0, 3605.25]
    # an hour of virtual time, no real waiting: milliseconds; waiting for real would take
    # 3,605 s, so a bound a loaded machine cannot miss still fails it
    assert time.perf_counter() - started < 30.0


def test_concurrent_sleepers_wake_in_time_order() -> None:
    clock = LoopClock()
    order: list[tuple[str, float]] = []

    async def sleeper(name: str, dt: float) -> None:
        await clock.sleep(dt)
        order.append((name, clock.now()))

    async def main() -> None:
        await asyncio.gather(sleeper("c", 3), sleeper("a", 1), sleeper("b", 2))

    run_virtual(main())
    assert order == [("a", 1.0), ("b", 2.0), ("c", 3.0)]


def test_wait_event_returns_false_on_timeout_and_true_when_set() -> None:
    clock = LoopClock()

    async def main() -> tuple[bool, float, bool, float]:
        event = asyncio.Event()
        timed_out = await clock.wait_event(event, 2.0)
        t1 = clock.now()
        asyncio.get_running_loop().call_later(1.5, event.set)
        woken = await clock.wait_event(event, 10.0)
        return timed_out, t1, woken, clock.now()

    assert run_virtual(main()) == (False, 2.0, True, 3.5)


def test_scaled_clock_runs_faster_than_loop_time() -> None:
    clock = LoopClock(scale=10.0)

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        start_loop, start = loop.time(), clock.now()
        await clock.sleep(20.0)
        return loop.time() - start_loop, clock.now() - start

    loop_elapsed, clock_elapsed = run_virtual(main())
    assert loop_elapsed == pytest.approx(2.0)
    assert clock_elapsed == pytest.approx(20.0)


def test_deadlock_is_reported_instead_of_hanging() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(VirtualTimeDeadlock):
        run_virtual(main())


def test_clock_scale_must_be_positive() -> None:
    with pytest.raises(ValueError):
        LoopClock(scale=0)


def test_virtual_loop_starts_at_zero() -> None:
    loop = VirtualTimeLoop()
    try:
        assert loop.time() == 0.0
    finally:
        loop.close()


def test_work_in_a_thread_takes_no_virtual_time() -> None:
    """``asyncio.to_thread`` work is waited for in real time; the virtual clock then goes on
    from where it was (no deadlock while the thread runs, no time skipped for it)."""

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        await asyncio.to_thread(time.sleep, 0.05)
        after_thread = loop.time()
        await asyncio.sleep(5.0)
        return after_thread, loop.time()

    assert run_virtual(main()) == (0.0, 5.0)
