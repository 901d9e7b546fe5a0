"""The API keys' rate limits without a database (proxy/callpath/limits.py, limiter.py): the
minute windows and Retry-After, the check, the reservations and the counts, what a call is
charged however it ends, table-driven; the bounds several replicas keep to, over generated
calls, cancellations and syncs (hypothesis, derandomized); and the limiter's syncing with a
store that fails, then answers again (nothing lost, logged once), or hangs."""

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
    Progress,
    RateBook,
    Refusal,
    Ticket,
    charge,
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
    ("limits", "requests", "tokens", "reserve", "expected"),
    [
        (RateLimits("k", rpm=3), 0, 0, 0, None),
        (RateLimits("k", rpm=3), 2, 0, 500, None),  # no tpm: any reservation
        (RateLimits("k", rpm=3), 3, 0, 0, Refusal("requests", 3, 45)),
        (RateLimits("k", rpm=3), 3, 10**9, 0, Refusal("requests", 3, 45)),  # requests first
        (RateLimits("k", tpm=100), 10**6, 99, 0, None),
        (RateLimits("k", tpm=100), 0, 100, 0, Refusal("tokens", 100, 45, 0, 0)),
        (RateLimits("k", tpm=100), 0, 250, 0, Refusal("tokens", 100, 45, 0, 0)),  # crossed
        (RateLimits("k", rpm=5, tpm=100), 4, 99, 1, None),
        (RateLimits("k", rpm=5, tpm=100), 4, 100, 1, Refusal("tokens", 100, 45, 1, 0)),
        (RateLimits("k", rpm=1), 0, 0, 0, None),
        # the reservation must fit what is left of the minute's tokens
        (RateLimits("k", tpm=100), 0, 60, 40, None),
        (RateLimits("k", tpm=100), 0, 60, 41, Refusal("tokens", 100, 45, 41, 40)),
        (RateLimits("k", tpm=100), 0, 0, 100, None),
        # a call larger than the whole limit reserves all of it: alone in an unused minute
        (RateLimits("k", tpm=100), 0, 0, 10**6, None),
        (RateLimits("k", tpm=100), 0, 1, 10**6, Refusal("tokens", 100, 45, 100, 99)),
        (
            RateLimits("k", tpm=20_000),
            0,
            16_000,
            8_000,
            Refusal("tokens", 20_000, 45, 8_000, 4_000),
        ),
    ],
)
def test_a_call_is_refused_once_the_minute_used_a_limit_or_cannot_hold_its_reservation(
    limits: RateLimits, requests: int, tokens: int, reserve: int, expected: Refusal | None
) -> None:
    book = RateBook()
    now = T0 + 15.25
    book.synced(window_of(now), {limits.key_id: (requests, tokens)})  # the store's totals
    admitted = book.admit(limits, now, reserve)
    used = book.used(limits.key_id, T0)
    if expected is None:
        reserved = min(reserve, limits.tpm) if limits.tpm is not None else reserve
        assert admitted == Ticket(limits.key_id, T0, reserved)
        assert (used.requests, used.tokens) == (requests + 1, tokens + reserved)
    else:
        assert admitted == expected
        assert (used.requests, used.tokens) == (requests, tokens)  # a refusal is not counted


@pytest.mark.parametrize(
    ("progress", "finished", "cancelled", "charged"),
    [
        # finished: the engine's own count, whatever the proxy estimated
        (Progress(8_000, 200, True, True, 200), 8_150, False, 8_150),
        (Progress(8_000, 200, False, True, 1), 8_050, False, 8_050),
        # cancelled before its first token: its prompt (the engine may have prefilled it)
        (Progress(8_000, 200, True), None, True, 8_000),
        (Progress(8_000, 200, False), None, True, 8_000),
        # failed (or refused by the runtime, or never reached it) before its first token
        (Progress(8_000, 200, True), None, False, 0),
        # a stream cancelled or failed after some deltas: the prompt and the output streamed
        (Progress(8_000, 200, True, True, 1), None, True, 8_001),
        (Progress(8_000, 200, True, True, 197), None, True, 8_197),  # a few deltas short
        (Progress(8_000, 200, True, True, 60), None, False, 8_060),
        # not streamed: nothing is seen between the first token and the end: the whole limit
        (Progress(8_000, 200, False, True, 1), None, True, 8_200),
        (Progress(8_000, 200, False, True, 1), None, False, 8_200),
    ],
)
def test_a_call_is_charged_what_the_engine_processed_however_it_ends(
    progress: Progress, finished: int | None, cancelled: bool, charged: int
) -> None:
    assert charge(progress, finished_tokens=finished, cancelled=cancelled) == charged


def test_a_reservation_is_given_back_when_refused_and_settles_in_its_own_minute() -> None:
    book, limits = RateBook(), RateLimits("k", tpm=20_000)
    first = book.admit(limits, T0 + 1, 8_000)
    second = book.admit(limits, T0 + 2, 8_000)
    assert isinstance(first, Ticket) and isinstance(second, Ticket)
    assert isinstance(book.admit(limits, T0 + 3, 8_000), Refusal)  # 24,000 would not fit
    book.release(second)  # refused further on: its request and tokens back
    assert (book.used("k", T0).requests, book.used("k", T0).tokens) == (1, 8_000)
    book.settle(first, 120)  # cancelled early: charged what it used
    assert book.used("k", T0).tokens == 120
    third = book.admit(limits, T0 + 59, 19_880)
    assert isinstance(third, Ticket)
    book.settle(third, 25_000)  # ended in the next minute, used more than it reserved
    assert book.used("k", T0).tokens == 25_120  # in the minute it was admitted in
    assert book.used("k", T0 + 60).tokens == 0
    taken = book.take(T0 + 61)
    assert {slot: (c.requests, c.tokens) for slot, c in taken.items()} == {("k", T0): (2, 25_120)}


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
    ticket = book.admit(KEY, T0 + 60, 10)  # a new minute: nothing used yet
    assert isinstance(ticket, Ticket)
    book.settle(ticket, 40)
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
    ticket = book.admit(KEY, T0 + 1)
    assert isinstance(ticket, Ticket)
    book.settle(ticket, 7)
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


@dataclass
class Running:
    """A call admitted and not yet ended: its replica, its ticket and what it counts now."""

    replica: int
    ticket: Ticket


@dataclass
class TokenCluster:
    """Replicas (their books) over one shared store of one key's window, counting tokens:
    calls reserve, end (settle to a charge) and syncs happen in any order. ``truth``: every
    admitted call's count now (its reservation while it runs, its charge once it ended)."""

    replicas: int
    tpm: int
    books: list[RateBook] = field(default_factory=list)
    store: tuple[int, int] = (0, 0)
    running: list[Running] = field(default_factory=list)
    truth: int = 0
    excess: int = 0  # Σ max(0, charge − reservation)
    reserved_since_sync: list[int] = field(default_factory=list)
    most_reserved_between_syncs: int = 0

    def __post_init__(self) -> None:
        self.books = [RateBook() for _ in range(self.replicas)]
        self.reserved_since_sync = [0] * self.replicas

    def call(self, r: int, estimate: int) -> None:
        result = self.books[r].admit(RateLimits("k", tpm=self.tpm), T0 + 1, estimate)
        if isinstance(result, Ticket):
            assert result.reserved_tokens == min(estimate, self.tpm)
            self.running.append(Running(r, result))
            self.truth += result.reserved_tokens
            self.reserved_since_sync[r] += result.reserved_tokens
            self.most_reserved_between_syncs = max(
                self.most_reserved_between_syncs, self.reserved_since_sync[r]
            )
        elif self.replicas == 1:  # one replica knows the truth: refused only if it does not fit
            assert self.truth + min(estimate, self.tpm) > self.tpm

    def end(self, n: int, tenths: int) -> None:
        """The ``n``-th running call ends, charged ``tenths`` / 10 of its reservation (below
        10: cancelled or a short reply; above: the engine counted more than the estimate)."""
        if not self.running:
            return
        done = self.running.pop(n % len(self.running))
        reserved = done.ticket.reserved_tokens
        charged = reserved * tenths // 10
        self.books[done.replica].settle(done.ticket, charged)
        self.truth += charged - reserved
        self.excess += max(0, charged - reserved)

    def sync(self, r: int) -> None:
        taken = self.books[r].take(T0 + 1)
        requests, tokens = self.store
        for counts in taken.values():
            requests, tokens = requests + counts.requests, tokens + counts.tokens
        self.store = (requests, tokens)
        self.books[r].synced(T0, {"k": self.store})
        self.reserved_since_sync[r] = 0


OP = st.one_of(
    st.tuples(st.just("call"), st.integers(0, 2), st.integers(1, 12_000)),
    st.tuples(st.just("end"), st.integers(0, 40), st.integers(0, 12)),
    st.tuples(st.just("sync"), st.integers(0, 2), st.just(0)),
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.integers(1, 3), st.integers(1_000, 30_000), st.lists(OP, max_size=120))
def test_replicas_pass_the_tokens_by_one_sync_interval_of_the_others_reservations_at_most(
    replicas: int, tpm: int, run: list[tuple[str, int, int]]
) -> None:
    """Calls that reserve, end charged less (cancelled) or more (the engine's count) than they
    reserved, and syncs, in any order: the window's tokens (every call's charge, a running
    call's reservation) stay within ``tpm + (replicas − 1) × K + E``, K the most tokens one
    replica's calls reserve between two of its syncs, E what calls used past their
    reservations; one replica never refuses a call that fits (``TokenCluster.call``)."""
    cluster = TokenCluster(replicas, tpm)
    for op, a, b in run:
        if op == "call":
            cluster.call(a % replicas, b)
        elif op == "end":
            cluster.end(a, b)
        else:
            cluster.sync(a % replicas)
    bound = tpm + (replicas - 1) * cluster.most_reserved_between_syncs + cluster.excess
    assert cluster.truth <= bound
    if replicas == 1:
        assert cluster.truth <= tpm + cluster.excess


def test_the_token_bound_is_reached_and_a_burst_is_held_to_it() -> None:
    """20 calls of 8,000 tokens at once against 20,000 a minute: 2 admitted on one replica,
    2 on each of two that have not synced (≤ 3 + one per replica); calls of 10,000 on two
    replicas reach the bound, 20,000 + (2 − 1) × 20,000."""
    for replicas, admitted in ((1, 2), (2, 4)):
        cluster = TokenCluster(replicas, 20_000)
        for n in range(20):
            cluster.call(n % replicas, 8_000)
        assert len(cluster.running) == admitted <= 3 + replicas
    cluster = TokenCluster(2, 20_000)
    for n in range(8):
        cluster.call(n % 2, 10_000)
    assert cluster.truth == 40_000 == 20_000 + cluster.most_reserved_between_syncs
    for r in range(2):
        cluster.sync(r)
    cluster.call(0, 1)
    assert len(cluster.running) == 4  # no more once synced


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
async def test_the_limiter_settles_reservations_and_forgets_old_minutes() -> None:
    store, now = FlakyUsage(), [T0 + 5]
    limiter = RateLimiter(store, clock=lambda: now[0])
    await limiter.start()
    try:
        assert limiter.admit(None, 10**6) is None  # a key without limits: nothing counted
        assert limiter.settlement(None) is None
        tokens = RateLimits("k2", tpm=100)
        ticket = limiter.admit(tokens, 80)
        with pytest.raises(ApiError, match="reserves 80 tokens") as refused:
            limiter.admit(tokens, 80)  # 160 would not fit
        assert "100 tokens per minute" in refused.value.message
        assert "20 are left" in refused.value.message
        settle = limiter.settlement(ticket)
        assert settle is not None
        settle(30)  # it ended having used 30
        settle(30)  # once only
        assert limiter.admit(tokens, 70) is not None  # 30 + 70 fits
        with pytest.raises(ApiError, match="100 tokens per minute"):
            limiter.admit(tokens, 1)
        now[0] = T0 + 60 * 3 + 1  # three minutes on
        assert limiter.admit(tokens, 5) is not None
    finally:
        await limiter.close()  # the last flush
    later = datetime.fromtimestamp(T0 + 180, UTC)
    assert store.rows == {("k2", later): (1, 5)}
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
