"""The API keys' rate limits without a database (proxy/callpath/limits.py, limiter.py): the
minute windows and Retry-After, the check and the counts, table-driven; the bound several
replicas keep to, over generated calls and syncs (hypothesis, derandomized); and the limiter's
syncing with a store that fails, then answers again (nothing lost, logged once), or hangs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talaria.proxy.callpath import limiter as limiter_module
from talaria.proxy.callpath.limiter import RateLimiter
from talaria.proxy.callpath.limits import (
    RateBook,
    Refusal,
    Ticket,
    retry_after_s,
    window_of,
)
from talaria.proxy.contract.calls import RateLimits
from talaria.proxy.contract.errors import ApiError

T0 = 1_800_000_000.0  # a whole minute (UTC): 2027-01-15T08:00:00Z
assert T0 % 60 == 0
KEY = RateLimits("k1", rpm=3)


@pytest.mark.parametrize(
    ("now", "window", "retry"),
    [
        (T0, T0, 60),  # a window's first instant: the whole minute left
        (T0 + 0.2, T0, 60),  # 59.8 s left: rounded up
        (T0 + 15.25, T0, 45),
        (T0 + 59.0, T0, 1),
        (T0 + 59.9, T0, 1),  # at least 1
        (T0 + 60.0, T0 + 60, 60),  # the next window
        (T0 - 0.5, T0 - 60, 1),
    ],
)
def test_windows_are_utc_minutes_and_retry_after_is_the_rest_of_one(
    now: float, window: float, retry: int
) -> None:
    assert window_of(now) == window
    assert retry_after_s(now) == retry
    assert datetime.fromtimestamp(window_of(now), UTC).second == 0


@pytest.mark.parametrize(
    ("limits", "requests", "tokens", "expected"),
    [
        (RateLimits("k", rpm=3), 0, 0, None),
        (RateLimits("k", rpm=3), 2, 0, None),
        (RateLimits("k", rpm=3), 3, 0, Refusal("requests", 3, 45)),
        (RateLimits("k", rpm=3), 3, 10**9, Refusal("requests", 3, 45)),  # requests first
        (RateLimits("k", tpm=100), 10**6, 99, None),
        (RateLimits("k", tpm=100), 0, 100, Refusal("tokens", 100, 45)),
        (RateLimits("k", tpm=100), 0, 250, Refusal("tokens", 100, 45)),  # a call crossed it
        (RateLimits("k", rpm=5, tpm=100), 4, 99, None),
        (RateLimits("k", rpm=5, tpm=100), 4, 100, Refusal("tokens", 100, 45)),
        (RateLimits("k", rpm=1), 0, 0, None),
    ],
)
def test_a_call_is_refused_once_the_minute_used_a_limit(
    limits: RateLimits, requests: int, tokens: int, expected: Refusal | None
) -> None:
    book = RateBook()
    now = T0 + 15.25
    book.synced(window_of(now), {limits.key_id: (requests, tokens)})  # the store's totals
    admitted = book.admit(limits, now)
    if expected is None:
        assert admitted == Ticket(limits.key_id, T0)
        assert book.used(limits.key_id, T0).requests == requests + 1
    else:
        assert admitted == expected
        assert book.used(limits.key_id, T0).requests == requests  # a refusal is not counted


def test_counts_are_the_store_totals_plus_the_replicas_own_since() -> None:
    book = RateBook()
    now = T0 + 10
    for _ in range(3):
        assert isinstance(book.admit(KEY, now), Ticket)
    assert book.admit(KEY, now) == Refusal("requests", 3, 50)
    taken = book.take(now)
    assert {slot: (c.requests, c.tokens) for slot, c in taken.items()} == {("k1", T0): (3, 0)}
    assert book.admit(KEY, now) == Refusal("requests", 3, 50)  # being flushed: still counted
    book.synced(T0, {"k1": (3, 0)})
    assert book.admit(KEY, now) == Refusal("requests", 3, 50)
    assert isinstance(book.admit(KEY, T0 + 60), Ticket)  # a new minute: nothing used yet
    book.spend("k1", 40, T0 + 61)
    assert (book.used("k1", T0 + 60).requests, book.used("k1", T0 + 60).tokens) == (1, 40)


def test_a_call_given_back_is_not_counted_even_once_flushed() -> None:
    book = RateBook()
    ticket = book.admit(KEY, T0 + 1)
    assert isinstance(ticket, Ticket)
    taken = book.take(T0 + 1)  # its +1 is on its way to the store
    book.release(ticket)  # and the call is refused further on
    assert book.used("k1", T0).requests == 0
    book.synced(T0, {"k1": (taken["k1", T0].requests, 0)})
    again = book.take(T0 + 2)
    assert {slot: c.requests for slot, c in again.items()} == {("k1", T0): -1}


def test_a_failed_sync_keeps_its_counts_for_the_next_and_old_windows_are_dropped() -> None:
    book = RateBook()
    book.admit(KEY, T0 + 1)
    book.spend("k1", 7, T0 + 2)
    book.take(T0 + 3)
    book.failed()
    book.admit(KEY, T0 + 4)
    assert book.used("k1", T0).requests == 2
    taken = book.take(T0 + 5)
    assert {slot: (c.requests, c.tokens) for slot, c in taken.items()} == {("k1", T0): (2, 7)}
    book.failed()
    assert book.take(T0 + 60 * 2 + 1) == {}  # two minutes on: no longer worth sending


# -- several replicas over one shared counter ---------------------------------------------------


@dataclass
class Cluster:
    """Replicas (their books) over one shared store (key → requests of the one window)."""

    replicas: int
    limit: int
    books: list[RateBook] = field(default_factory=list)
    store: int = 0
    admitted: list[int] = field(default_factory=list)  # per replica
    since_sync: list[int] = field(default_factory=list)  # calls admitted since its last sync
    most_between_syncs: int = 0

    def __post_init__(self) -> None:
        self.books = [RateBook() for _ in range(self.replicas)]
        self.admitted = [0] * self.replicas
        self.since_sync = [0] * self.replicas

    def call(self, r: int) -> None:
        truth = sum(self.admitted)
        result = self.books[r].admit(RateLimits("k", rpm=self.limit), T0 + 1)
        if isinstance(result, Ticket):
            self.admitted[r] += 1
            self.since_sync[r] += 1
            self.most_between_syncs = max(self.most_between_syncs, self.since_sync[r])
        else:
            assert truth >= self.limit  # never refused below the limit

    def flush(self, r: int) -> None:
        taken = self.books[r].take(T0 + 1)
        self.store += sum(c.requests for c in taken.values())
        self.since_sync[r] = 0

    def read(self, r: int) -> None:
        self.books[r].synced(T0, {"k": (self.store, 0)})


RUN = st.lists(st.tuples(st.booleans(), st.integers(0, 2)), max_size=150)
"""A run: each entry a sync (True) or a call (False) of replica ``n % replicas``."""


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.integers(1, 3), st.integers(1, 12), RUN)
def test_replicas_pass_a_limit_by_one_sync_interval_of_the_others_at_most(
    replicas: int, limit: int, run: list[tuple[bool, int]]
) -> None:
    """Calls and syncs (each a flush, then a read, as one transaction) in any order: a window
    admits at most ``limit + (replicas − 1) × k``, k the most calls one replica admits between
    two of its syncs; no call is refused below the limit (``Cluster.call``); one replica admits
    exactly ``min(calls, limit)``."""
    cluster = Cluster(replicas, limit)
    for sync, n in run:
        if sync:
            cluster.flush(n % replicas)
            cluster.read(n % replicas)
        else:
            cluster.call(n % replicas)
    total = sum(cluster.admitted)
    assert total <= limit + (replicas - 1) * cluster.most_between_syncs
    if replicas == 1:
        assert total == min(limit, sum(1 for sync, _ in run if not sync))


def test_the_bound_is_reached() -> None:
    """Replicas that sync rarely each spend the whole limit before hearing of the others: 10 +
    (3 − 1) × 10."""
    cluster = Cluster(3, 10)
    for r in range(3):
        for _ in range(12):
            cluster.call(r)
    assert cluster.admitted == [10, 10, 10]
    for r in range(3):
        cluster.flush(r)
        cluster.read(r)
    for r in range(3):
        cluster.call(r)
    assert sum(cluster.admitted) == 30  # no more once synced


# -- the limiter and its store ------------------------------------------------------------------


class FlakyUsage:
    """A ``UsageStore`` in memory that fails while ``down``."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, datetime], tuple[int, int]] = {}
        self.down = False
        self.forgotten: list[datetime] = []

    async def add_usage(
        self, added: Mapping[tuple[str, datetime], tuple[int, int]], window: datetime
    ) -> dict[str, tuple[int, int]]:
        if self.down:
            raise ConnectionError("store down")
        for slot, (r, t) in added.items():
            old = self.rows.get(slot, (0, 0))
            self.rows[slot] = (old[0] + r, old[1] + t)
        return {key: counts for (key, w), counts in self.rows.items() if w == window}

    async def forget_usage_before(self, cutoff: datetime) -> int:
        if self.down:
            raise ConnectionError("store down")
        self.forgotten.append(cutoff)
        old = [slot for slot in self.rows if slot[1] < cutoff]
        for slot in old:
            del self.rows[slot]
        return len(old)


@pytest.mark.asyncio
async def test_the_store_down_limits_on_own_counts_loses_nothing_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, now = FlakyUsage(), [T0 + 5]
    limiter = RateLimiter(store, clock=lambda: now[0])
    minute = datetime.fromtimestamp(T0, UTC)
    store.rows[("k1", minute)] = (1, 0)  # another replica's call
    assert await limiter.sync_once()
    store.down = True
    caplog.set_level(logging.WARNING, logger="talaria.proxy.callpath.limiter")
    assert limiter.admit(KEY) is not None
    for _ in range(3):
        assert not await limiter.sync_once()
    assert limiter.admit(KEY) is not None
    with pytest.raises(ApiError) as refused:
        limiter.admit(KEY)  # 1 known from the store + 2 of its own
    assert (refused.value.status, refused.value.code) == (429, "rate_limit_exceeded")
    assert refused.value.headers() == {"Retry-After": "55"}
    assert "3 requests per minute" in refused.value.message
    store.down = False
    assert await limiter.sync_once()
    assert store.rows == {("k1", minute): (3, 0)}  # both its counts arrived, once
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and "cannot sync" in warnings[0] and "again" in warnings[1]


@pytest.mark.asyncio
async def test_the_limiter_counts_finished_calls_tokens_and_forgets_old_minutes() -> None:
    store, now = FlakyUsage(), [T0 + 5]
    limiter = RateLimiter(store, clock=lambda: now[0])
    await limiter.start()
    try:
        assert limiter.admit(None) is None  # a key without limits: nothing counted
        assert limiter.on_finished(None) is None
        tokens = RateLimits("k2", tpm=100)
        ticket = limiter.admit(tokens)
        finished = limiter.on_finished(ticket)
        assert finished is not None

        @dataclass
        class Result:
            prompt_tokens: int = 90
            output_tokens: int = 20

        @dataclass
        class Outcome:
            result: Result = field(default_factory=Result)

        finished(Outcome())  # type: ignore[arg-type]
        with pytest.raises(ApiError, match="100 tokens per minute"):
            limiter.admit(tokens)
        now[0] = T0 + 60 * 3 + 1  # three minutes on
        assert limiter.admit(tokens) is not None
    finally:
        await limiter.close()  # the last flush
    later = datetime.fromtimestamp(T0 + 180, UTC)
    assert store.rows == {("k2", later): (1, 0)}
    assert store.forgotten[-1] == datetime.fromtimestamp(T0 + 120, UTC)


class HangingUsage(FlakyUsage):
    """A store that never answers an add (a database that hangs)."""

    async def add_usage(
        self, added: Mapping[tuple[str, datetime], tuple[int, int]], window: datetime
    ) -> dict[str, tuple[int, int]]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@pytest.mark.asyncio
async def test_a_store_that_hangs_fails_the_sync_and_keeps_its_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limiter_module, "STORE_TIMEOUT_S", 0.01)
    limiter = RateLimiter(HangingUsage(), clock=lambda: T0 + 5)
    limiter.admit(KEY)
    assert not await limiter.sync_once()
    assert not await limiter.sync_once()  # not stuck behind the first
    limiter.admit(KEY)
    limiter.admit(KEY)
    with pytest.raises(ApiError, match="3 requests per minute"):
        limiter.admit(KEY)  # every count still counted
