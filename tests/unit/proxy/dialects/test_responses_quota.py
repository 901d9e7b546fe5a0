"""The storage quota of stored responses (per tenant, in all), and the response cache's byte
bound: the rules of proxy/dialects/responses/quota.py and proxy/dialects/responses/store.py,
clock-free."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from talaria.proxy.contract.errors import ApiError
from talaria.proxy.dialects.responses.quota import REFRESH_S, StorageQuota, json_bytes, stored_bytes
from talaria.proxy.dialects.responses.store import ResponseStore

T0 = datetime(2026, 12, 1, tzinfo=UTC)
DAY = timedelta(days=1)


def _quota() -> StorageQuota:
    return StorageQuota(tenant_quota_bytes=100, max_bytes=150)


def _store(q: StorageQuota, tenant: str, rid: str, nbytes: int, expires: datetime) -> None:
    q.settle(q.reserve(tenant, nbytes, T0), rid, nbytes, expires)


@pytest.mark.parametrize(
    ("stored", "tenant", "nbytes", "refused"),
    [
        ({}, "A", 100, None),  # up to the quota, inclusive
        ({}, "A", 101, "tenant"),
        ({"A": 60}, "A", 40, None),
        ({"A": 60}, "A", 41, "tenant"),
        ({"A": 100}, "B", 50, None),  # another tenant is unaffected...
        ({"A": 100, "B": 40}, "B", 11, "server"),  # ...until the global cap
        ({"A": 100, "B": 40}, "B", 10, None),
    ],
)
def test_a_call_is_admitted_within_its_tenants_quota_and_the_cap(
    stored: dict[str, int], tenant: str, nbytes: int, refused: str | None
) -> None:
    q = _quota()
    for i, (owner, size) in enumerate(stored.items()):
        _store(q, owner, f"r{i}", size, T0 + DAY)
    if refused is None:
        q.reserve(tenant, nbytes, T0)
        return
    with pytest.raises(ApiError) as info:
        q.reserve(tenant, nbytes, T0)
    error = info.value
    assert (error.status, error.code, error.type) == (
        429,
        "storage_quota_exceeded",
        "rate_limit_error",
    )
    assert refused in error.message and error.retry_after_s is not None


def test_estimates_of_calls_in_flight_count_until_settled_or_released() -> None:
    q = _quota()
    first = q.reserve("A", 60, T0)
    with pytest.raises(ApiError):
        q.reserve("A", 41, T0)  # 60 held + 41 > 100
    q.release(first)
    q.release(first)  # idempotent
    second = q.reserve("A", 60, T0)
    q.settle(second, "r1", 75, T0 + DAY)  # the exact size adds the output
    assert (q.used("A", T0), q.held("A"), q.held()) == (75, 0, 0)
    q.release(second)  # the call's end after its record: nothing more to drop
    assert q.held("A") == 0


def test_deletions_and_expiry_free_quota() -> None:
    q = _quota()
    _store(q, "A", "r1", 60, T0 + DAY)
    _store(q, "A", "r2", 30, T0 + 2 * DAY)
    q.freed("A", "r1", 60)
    assert q.used("A", T0) == 30
    assert q.used("A", T0 + DAY) == 30  # r1 deleted: its expiry subtracts nothing more
    assert q.used("A", T0 + 2 * DAY) == 0
    q.freed("A", "old", 5)  # a row stored before the last refresh
    assert q.used("A", T0) == 0


def test_a_refresh_takes_the_stores_totals_and_keeps_what_came_after_its_mark() -> None:
    q = _quota()
    _store(q, "A", "r1", 40, T0 + DAY)  # flushed before the query: in the totals
    mark = q.begin_refresh()
    _store(q, "A", "r2", 10, T0 + DAY)  # stored while the query ran: maybe not in them
    q.freed("A", "r0", 20)  # a deletion before the refresh ends: in them
    q.finish_refresh(mark, {"A": (40 + 30, T0 + DAY / 2), "B": (50, T0 + DAY)})
    assert (q.used("A", T0), q.used("B", T0), q.used_all(T0)) == (80, 50, 130)
    with pytest.raises(ApiError) as info:  # the cap: 130 + 21 > 150
        q.reserve("C", 21, T0)
    assert info.value.retry_after_s == pytest.approx(DAY.total_seconds() / 2)


@pytest.mark.parametrize(
    ("expires_in", "retry_after_s"),
    [(DAY, DAY.total_seconds()), (timedelta(seconds=3), REFRESH_S), (-DAY, REFRESH_S)],
)
def test_retry_after_is_until_the_oldest_response_expires(
    expires_in: timedelta, retry_after_s: float
) -> None:
    q = _quota()
    q.finish_refresh(q.begin_refresh(), {"A": (100, T0 + expires_in)})
    with pytest.raises(ApiError) as info:
        q.reserve("A", 1, T0)
    assert info.value.retry_after_s == pytest.approx(retry_after_s)


def test_a_response_counts_the_encoded_size_of_all_its_fields() -> None:
    response = {"id": "resp_1", "model": "glm", "output": [{"text": "é"}]}
    items = [{"type": "message", "content": "hi"}]
    size = stored_bytes(response, json_bytes(items), "resp_1", "tenant", "ses_1", "glm")
    expected = len('{"id":"resp_1","model":"glm","output":[{"text":"\\u00e9"}]}')
    expected += len('[{"type":"message","content":"hi"}]') + len("resp_1tenantses_1glm") + 16
    assert size == expected


class _NoStore:
    """Writer and store of a cache test: nothing is ever found outside the cache."""

    async def flush(self) -> None:
        return None

    async def get_response(self, *args: object) -> None:
        return None


@pytest.mark.parametrize("seed", range(5))
def test_the_cache_stays_under_its_byte_bound(seed: int) -> None:
    """Responses of random sizes: the cache never holds more than its bound; it holds the
    newest one unless that one alone is larger; a large one pushes no others out."""
    rng = random.Random(seed)
    bound = 50_000
    nothing = cast(Any, _NoStore())
    responses = ResponseStore(
        nothing, nothing, tenant_quota_bytes=10**9, max_bytes=10**9, cache_max_bytes=bound
    )

    def cached(response_id: str) -> bool:
        return asyncio.run(responses.load("A", response_id)) is not None

    for i in range(200):
        text = "x" * rng.choice([10, 1_000, 10_000, 60_000])
        items = [{"type": "message", "role": "user", "content": text}]
        start = {"id": f"resp_{i}", "model": "glm", "output": []}
        before = responses.cache_entries
        record = responses.prepare(
            responses.admit("A", start, items), session_key="ses", response=start
        )
        assert responses.cache_bytes <= bound and responses.cache_entries <= 256
        assert cached(record.response_id) == (record.size_bytes <= bound)
        if record.size_bytes > bound:
            assert responses.cache_entries == before
    assert 1 < responses.cache_entries < 200
