"""The arithmetic of the API keys' rate limits (``talaria keys create --rpm --tpm``): minute
windows, and the counts one replica keeps of them. Pure: no I/O and no clock of its own
(proxy/callpath/limiter.py drives it, and syncs it with the store every
``TALARIA_RATE_SYNC_S``).

**Windows.** Fixed minutes of UTC wall time: the window of ``now`` (seconds since the epoch)
begins at ``⌊now / 60⌋ · 60``. A refused call's ``Retry-After`` is the seconds left in it,
rounded up, at least 1. A fixed window lets a key spend its limit at the end of one minute and
again at the start of the next (as LiteLLM's per-minute limits do).

**Counts.** For each key a replica knows, of a window: ``synced``, the store's totals as of its
last sync (every replica's counts added by then, its own included); ``flushing``, its own counts
being added to the store now; ``pending``, its own counts since. A key's use of the window is
their sum. A call is refused when ``use.requests ≥ rpm`` or ``use.tokens ≥ tpm``; otherwise its
request is counted at once (:meth:`RateBook.admit`), and given back if the call is refused later
on its way (:meth:`RateBook.release`). Its tokens (prompt + output) are counted when it ends, in
the window it ends in (:meth:`RateBook.spend`): the call that crosses ``tpm`` is not cut, the
next one is refused. A failed sync puts its counts back into ``pending``: nothing is lost, and
the replica limits on what it knows meanwhile.

**Bound.** With one replica a window's count is exact: a key never gets more than ``rpm`` calls
in it. With several, a replica does not see the calls the others admitted since their last
sync, so a window admits at most ``rpm + (replicas − 1) × k``, k the most calls of the key one
replica admits in one sync interval (``TALARIA_RATE_SYNC_S``, plus the sync's own time). Why:
take the replica z whose sync before its last admission is the latest of all such syncs. z's
calls since that sync fit in ``rpm`` with the totals it read then; every other replica had
synced no later before its own last admission, so what z's read missed of its calls is at most
one of its intervals. A sync is one transaction (add, then read); two that overlap in the
database can each miss the other's counts: one more interval of them. Tokens are counted as
calls end, so a window's tokens pass ``tpm`` by those of the calls admitted before the limit
showed: the calls running when it was crossed and, with several replicas, one sync interval's
calls of each other replica. tests/unit/test_rate_limits.py checks the bound over generated
calls and syncs in any order, and that it is reached.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from talaria.proxy.contract.calls import RateLimits

WINDOW_S = 60
"""A rate limit's window: one minute of UTC wall time."""
KEPT_WINDOWS = 2
"""Windows whose counts are kept (the current one and the one before); older counts, in the
store or not yet flushed, can no longer limit anything and are dropped."""


def window_of(now: float) -> int:
    """The start of the window ``now`` falls in (seconds since the epoch, a whole minute)."""
    return math.floor(now / WINDOW_S) * WINDOW_S


def retry_after_s(now: float) -> int:
    """Whole seconds from ``now`` to the end of its window, at least 1."""
    return max(1, math.ceil(window_of(now) + WINDOW_S - now))


@dataclass
class Counts:
    """Calls and tokens counted in one window."""

    requests: int = 0
    tokens: int = 0

    def add(self, requests: int, tokens: int) -> None:
        """Count ``requests`` more calls and ``tokens`` more tokens (negative: given back)."""
        self.requests += requests
        self.tokens += tokens


Slot = tuple[str, int]
"""(key id, window start): what one count is of."""


class Ticket(NamedTuple):
    """A call counted against its key's limits: which key, in which window."""

    key_id: str
    window: int


@dataclass(frozen=True)
class Refusal:
    """Why a call is refused: its key's ``limit`` (``requests`` or ``tokens`` per minute) of
    ``value`` is reached, until ``retry_after_s`` from now."""

    limit: str
    value: int
    retry_after_s: int


class RateBook:
    """One replica's counts of its rate-limited keys (module docstring)."""

    def __init__(self) -> None:
        self._synced_window: int | None = None
        self._synced: dict[str, Counts] = {}
        self._flushing: dict[Slot, Counts] = {}
        self._pending: dict[Slot, Counts] = {}

    def used(self, key_id: str, window: int) -> Counts:
        """What this replica knows the key used of ``window``: the store's totals as of the
        last sync, plus its own counts not in them."""
        used = Counts()
        if self._synced_window == window and key_id in self._synced:
            synced = self._synced[key_id]
            used.add(synced.requests, synced.tokens)
        for counts in (self._flushing, self._pending):
            mine = counts.get((key_id, window))
            if mine is not None:
                used.add(mine.requests, mine.tokens)
        return used

    def admit(self, limits: RateLimits, now: float) -> Ticket | Refusal:
        """Count a call of the key at ``now``, or the limit it is past (the requests' first)."""
        window = window_of(now)
        used = self.used(limits.key_id, window)
        if limits.rpm is not None and used.requests >= limits.rpm:
            return Refusal("requests", limits.rpm, retry_after_s(now))
        if limits.tpm is not None and used.tokens >= limits.tpm:
            return Refusal("tokens", limits.tpm, retry_after_s(now))
        self._count((limits.key_id, window), 1, 0)
        return Ticket(limits.key_id, window)

    def release(self, ticket: Ticket) -> None:
        """Give back an admitted call that did not run (refused further on)."""
        self._count(ticket, -1, 0)

    def spend(self, key_id: str, tokens: int, now: float) -> None:
        """Count the tokens of a call of the key that ended at ``now``."""
        if tokens > 0:
            self._count((key_id, window_of(now)), 0, tokens)

    def take(self, now: float) -> dict[Slot, Counts]:
        """The counts to add to the store now (nonzero, of the kept windows), held as
        ``flushing`` until :meth:`synced` or :meth:`failed`; one sync at a time."""
        assert not self._flushing, "a sync is already under way"
        oldest = window_of(now) - (KEPT_WINDOWS - 1) * WINDOW_S
        self._flushing = {
            slot: counts
            for slot, counts in self._pending.items()
            if slot[1] >= oldest and (counts.requests or counts.tokens)
        }
        self._pending = {}
        return {slot: Counts(c.requests, c.tokens) for slot, c in self._flushing.items()}

    def synced(self, window: int, totals: Mapping[str, tuple[int, int]]) -> None:
        """The taken counts are in the store, whose totals of ``window`` are ``totals`` (key
        id → (requests, tokens), every replica's, the taken counts included)."""
        self._flushing = {}
        self._synced_window = window
        self._synced = {key: Counts(r, t) for key, (r, t) in totals.items()}

    def failed(self) -> None:
        """The taken counts did not reach the store: back into ``pending``, for the next sync."""
        flushing, self._flushing = self._flushing, {}
        for slot, counts in flushing.items():
            self._count(slot, counts.requests, counts.tokens)

    @property
    def pending(self) -> int:
        """How many (key, window) counts wait for the next sync."""
        return len(self._pending)

    def _count(self, slot: Slot, requests: int, tokens: int) -> None:
        counts = self._pending.get(slot)
        if counts is None:
            counts = self._pending[slot] = Counts()
        counts.add(requests, tokens)
