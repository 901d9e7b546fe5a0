"""The runtime status cache (proxy/runtimes/status_cache.py): fresh, stale-while-revalidate,
expired; one fetch however many callers; after a failed fetch (or a call that found the
runtime unreachable) callers fail at once while one fetch retries; ttl 0 fetches every time.
A hand-driven clock and fetches the test releases."""

from __future__ import annotations

import asyncio

import pytest

from talaria.core.status import InstanceStatus
from talaria.proxy.runtimes.base import RuntimeUnavailable
from talaria.proxy.runtimes.status_cache import StatusCache


def _status(at_s: float) -> InstanceStatus:
    return InstanceStatus(instance="rt", at_s=at_s, active_model=None, models={})


class Runtime:
    """A fetch that waits until the test answers it (``answer``/``fail``)."""

    def __init__(self) -> None:
        self.waiting: list[asyncio.Future[InstanceStatus]] = []

    async def fetch(self) -> InstanceStatus:
        future: asyncio.Future[InstanceStatus] = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        return await future

    def answer(self, at_s: float) -> None:
        self.waiting.pop(0).set_result(_status(at_s))

    def fail(self) -> None:
        self.waiting.pop(0).set_exception(RuntimeUnavailable("gone"))


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _cache(runtime: Runtime, clock: list[float], ttl_s: float = 0.05) -> StatusCache:
    return StatusCache(runtime.fetch, ttl_s=ttl_s, stale_s=1.0, now=lambda: clock[0])


@pytest.mark.parametrize(
    ("age_s", "served_at_once", "fetches"),
    [
        (0.0, True, 0),  # fresh: nothing fetched
        (0.05, True, 0),  # at the ttl: still fresh
        (0.06, True, 1),  # stale: served, one refresh behind it
        (1.05, True, 1),  # at ttl + stale_s: still served
        (1.06, False, 1),  # expired: the caller waits for the fetch
    ],
)
def test_age_decides_whether_the_caller_waits(
    age_s: float, served_at_once: bool, fetches: int
) -> None:
    async def main() -> None:
        runtime, clock = Runtime(), [0.0]
        cache = _cache(runtime, clock)
        cache.put(_status(1.0))
        clock[0] += age_s
        getting = asyncio.ensure_future(cache.get())
        await _settle()
        assert getting.done() is served_at_once
        assert cache.fetches == fetches == len(runtime.waiting)
        if fetches:
            runtime.answer(2.0)
        status = await getting
        assert status.at_s == (1.0 if served_at_once else 2.0)
        await _settle()
        # after the refresh the new status is the fresh one
        assert (await cache.get()).at_s == (2.0 if fetches else 1.0)
        await cache.close()

    asyncio.run(main())


def test_many_callers_share_one_fetch() -> None:
    async def main() -> None:
        runtime, clock = Runtime(), [0.0]
        cache = _cache(runtime, clock)
        callers = [asyncio.ensure_future(cache.get()) for _ in range(50)]
        await _settle()
        assert len(runtime.waiting) == 1 and cache.fetches == 1
        runtime.answer(7.0)
        assert {s.at_s for s in await asyncio.gather(*callers)} == {7.0}
        clock[0] = 0.5  # stale: every caller served, still one refresh
        assert {(await cache.get()).at_s for _ in range(50)} == {7.0}
        await _settle()
        assert len(runtime.waiting) == 1 and cache.fetches == 2
        runtime.answer(8.0)
        await _settle()
        assert (await cache.get()).at_s == 8.0
        await cache.close()

    asyncio.run(main())


def test_after_a_failed_fetch_callers_fail_at_once_while_one_fetch_retries() -> None:
    """A runtime that stopped answering: the callers after the failure do not wait for it
    (the pool leaves it out of their decisions), one fetch retries behind them, and its first
    success is the status again (a SIGSTOPped runtime held every call for its whole stop:
    tests/e2e/test_chaos.py)."""

    async def main() -> None:
        runtime, clock = Runtime(), [0.0]
        cache = _cache(runtime, clock)
        cache.put(_status(1.0))
        clock[0] = 0.5
        assert (await cache.get()).at_s == 1.0  # served while the refresh runs
        await _settle()
        runtime.fail()
        await _settle()
        for _ in range(3):  # at once, each time; one retry in flight for all of them
            with pytest.raises(RuntimeUnavailable):
                await cache.get()
        await _settle()
        assert len(runtime.waiting) == 1 and cache.fetches == 2
        runtime.fail()  # the retry fails too: still left out, another retry starts
        await _settle()
        with pytest.raises(RuntimeUnavailable):
            await cache.get()
        await _settle()
        runtime.answer(9.0)  # it answers again
        await _settle()
        assert (await cache.get()).at_s == 9.0
        await cache.close()

    asyncio.run(main())


def test_a_cancelled_caller_does_not_cancel_the_shared_fetch() -> None:
    async def main() -> None:
        runtime, clock = Runtime(), [0.0]
        cache = _cache(runtime, clock)
        first = asyncio.ensure_future(cache.get())
        second = asyncio.ensure_future(cache.get())
        await _settle()
        first.cancel()
        await _settle()
        runtime.answer(3.0)
        assert (await second).at_s == 3.0
        await cache.close()

    asyncio.run(main())


def test_ttl_zero_fetches_every_time() -> None:
    async def main() -> None:
        runtime, clock = Runtime(), [0.0]
        cache = _cache(runtime, clock, ttl_s=0)
        cache.put(_status(1.0))
        for at_s in (2.0, 3.0):
            getting = asyncio.ensure_future(cache.get())
            await _settle()
            runtime.answer(at_s)
            assert (await getting).at_s == at_s
        assert cache.fetches == 2

    asyncio.run(main())


def test_a_call_that_found_the_runtime_unreachable_leaves_it_out_at_once() -> None:
    """A fresh status is no proof of life: after ``failed`` callers fail at once (the pool
    leaves the runtime out of their decisions) while one fetch retries, and its first success
    is the status again."""

    async def main() -> None:
        runtime, clock = Runtime(), [0.0]
        cache = _cache(runtime, clock)
        cache.put(_status(1.0))  # fresh for another 0.05 s
        cache.failed(RuntimeUnavailable("connection refused"))
        with pytest.raises(RuntimeUnavailable, match="connection refused"):
            await cache.get()
        await _settle()
        assert len(runtime.waiting) == 1 and cache.fetches == 1
        runtime.answer(4.0)
        await _settle()
        assert (await cache.get()).at_s == 4.0
        await cache.close()

    asyncio.run(main())
