"""The rate-limited keys' usage per minute (``key_usage``, proxy/store/usage.py), on both
backends: adds are atomic upserts (concurrent replicas' counts all arrive), a read returns
every key's totals of one minute, negative counts give calls back, many keys go in several
statements, and old minutes are deleted."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from talaria.proxy.store.db import make_sessionmaker
from talaria.proxy.store.repository import SqlStore
from talaria.proxy.store.usage import ROWS_PER_STATEMENT

MINUTE = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)
NEXT = MINUTE + timedelta(minutes=1)


@pytest.mark.asyncio
async def test_adds_sum_and_the_read_is_every_keys_total_of_one_minute(store: SqlStore) -> None:
    usage = store.usage
    assert await usage.add_usage({}, MINUTE) == {}
    assert await usage.add_usage({("a", MINUTE): (2, 100)}, MINUTE) == {"a": (2, 100)}
    added = {("a", MINUTE): (1, 50), ("b", MINUTE): (1, 0), ("a", NEXT): (1, 7)}
    assert await usage.add_usage(added, MINUTE) == {"a": (3, 150), "b": (1, 0)}
    assert await usage.add_usage({("b", MINUTE): (-1, 0)}, NEXT) == {"a": (1, 7)}  # given back
    assert await usage.add_usage({}, MINUTE) == {"a": (3, 150), "b": (0, 0)}


@pytest.mark.asyncio
async def test_replicas_adding_at_once_lose_no_count(engine: AsyncEngine) -> None:
    """Five replicas (each its own ``SqlStore`` over the engine), eight syncs each, all at
    once, every one adding to the same two keys: the totals are the sums."""
    replicas = [SqlStore(make_sessionmaker(engine)).usage for _ in range(5)]

    async def replica(n: int) -> None:
        for i in range(8):
            added = {("hot", MINUTE): (1, n + i), (f"own-{n}", MINUTE): (2, 0)}
            if i % 2:
                added["warm", MINUTE] = (1, 1)
            await replicas[n].add_usage(added, MINUTE)

    await asyncio.gather(*(replica(n) for n in range(5)))
    totals = await replicas[0].add_usage({}, MINUTE)
    assert totals["hot"] == (40, sum(n + i for n in range(5) for i in range(8)))
    assert totals["warm"] == (20, 20)
    assert all(totals[f"own-{n}"] == (16, 0) for n in range(5))


@pytest.mark.asyncio
async def test_many_keys_and_old_minutes_deleted(store: SqlStore) -> None:
    usage = store.usage
    many = {(f"k{i:05}", MINUTE): (1, i) for i in range(ROWS_PER_STATEMENT + 7)}
    totals = await usage.add_usage(many, MINUTE)
    assert len(totals) == ROWS_PER_STATEMENT + 7 and totals["k00042"] == (1, 42)
    await usage.add_usage({("k00042", NEXT): (1, 1)}, NEXT)
    assert await usage.forget_usage_before(MINUTE) == 0
    assert await usage.forget_usage_before(NEXT) == ROWS_PER_STATEMENT + 7
    assert await usage.add_usage({}, MINUTE) == {}
    assert await usage.add_usage({}, NEXT) == {"k00042": (1, 1)}
