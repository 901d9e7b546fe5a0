"""The arithmetic of the API keys' rate limits (``talaria keys create --rpm --tpm``): minute
windows, the counts one replica keeps of them, and what a call is charged. Pure: no I/O and no
clock of its own (proxy/callpath/limiter.py drives it, and syncs it with the store every
``TALARIA_RATE_SYNC_S``).

**Windows.** Fixed minutes of UTC wall time: the window of ``now`` (seconds since the epoch)
begins at ``⌊now / 60⌋ · 60``. A refused call's ``Retry-After`` is the seconds left in it,
rounded up, at least 1. A fixed window lets a key spend its limit at the end of one minute and
again at the start of the next (as LiteLLM's per-minute limits do).

**Counts.** For each key a replica knows, of a window: ``synced``, the store's totals as of its
last sync (every replica's counts added by then, its own included); ``flushing``, its own counts
being added to the store now; ``pending``, its own counts since. A key's use of the window is
their sum.

**Reservations.** A call is admitted (:meth:`RateBook.admit`) when ``use.requests < rpm`` and
its *reservation* fits what is left of ``tpm``: ``use.tokens + r ≤ tpm``, where ``r`` is its
estimate of the tokens it may use, ``prompt + output limit`` (proxy/callpath/door.py), capped
at ``tpm`` so that a call larger than the whole limit runs alone in an otherwise unused minute
instead of being refused for ever. Its request and ``r`` are counted at once, in the window it
is admitted in; a call refused further on before it runs gives both back
(:meth:`RateBook.release`); a call that ran settles to ``c``, the tokens it is charged
(:func:`charge`), in that same window (:meth:`RateBook.settle`: ``c − r`` more). Counting the
tokens before the work, not as calls end, is what bounds a burst: OpenAI's limits count a
request's ``max_tokens`` at its start too ("your rate limit is calculated as the maximum of
max_tokens and the estimated number of tokens based on the character count of your request",
platform.openai.com/docs/guides/rate-limits), as Cerebras's (``max_completion_tokens``, else
the context window, inference-docs.cerebras.ai/support/rate-limits), and OpenAI's Realtime API
reserves output tokens when a response starts and adjusts them when it ends (its
``rate_limits.updated`` event, platform.openai.com/docs/api-reference/realtime-server-events).
A failed sync puts
its counts back into ``pending``: nothing is lost, and the replica limits on what it knows
meanwhile.

**What a call is charged** (:func:`charge`): a call that finished, the engine's count of its
prompt and output; one that did not (its client went away, the proxy shut down, the runtime
failed), what the proxy saw the engine process: before its first token, its prompt when it was
cancelled (the engine may have prefilled all of it and the proxy cannot tell how much, and a
client that cancelled before the first token would otherwise have prefills for nothing) and
nothing when the runtime failed or refused it; from its first token on, its prompt plus the
output streamed to it, or, for a call not streamed (the runtime tells the proxy nothing
between a call's first token and its end), its whole output limit: the most it may have
produced. A stream cancelled a few deltas before its end is charged nearly all of it.

**Bound.** With one replica, each admission keeps the window's counts (the reservations of
running calls, the charges of ended ones) within ``tpm``, so the window's tokens once every
call ended are at most ``tpm + E``, E = ``Σ max(0, c − r)`` over its calls: what calls used
past their reservations, which only an engine that counts more prompt tokens than the
proxy's estimate, or a call whose reservation was capped at ``tpm``, can (a call that did not
finish is charged at most its prompt estimate and output limit: its uncapped reservation).
Its calls are at most ``rpm``. With several replicas, a replica does not see the
calls the others admitted (nor their settlements) since their last sync, so a window admits at
most ``rpm + (replicas − 1) × k`` calls and ``tpm + (replicas − 1) × K + E`` tokens, k the most
calls and K the most tokens of reservations one replica admits of the key in one sync interval
(``TALARIA_RATE_SYNC_S``, plus the sync's own time; K ≤ ``tpm`` plus what calls that ended in
that interval gave back). A burst of calls that reserve ``r`` tokens each, arriving within one
interval, is admitted ``⌊tpm / r⌋`` times per replica: with ``--tpm 20000``, 20 calls of 8,000
tokens are admitted twice on one replica, four times on two. Why: take the replica z whose sync
before its last admission is the latest of all such syncs. What z's calls count since that sync
fits the limit with the totals it read then; every other replica had synced no later before its
own last admission, so what z's read missed of its calls is at most one of its intervals of
admissions, and the settlements that raised a count past what z read add at most E. A sync is
one transaction (add, then read); two that overlap in the database can each miss the other's
counts: one more interval of them. tests/unit/proxy/callpath/test_rate_limits.py checks the
bound over generated calls, cancellations and syncs in any order, and that it is reached.
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
    """A call counted against its key's limits: which key, in which window, and the tokens it
    reserved there (module docstring, "Reservations")."""

    key_id: str
    window: int
    reserved_tokens: int = 0


@dataclass(frozen=True)
class Refusal:
    """Why a call is refused: its key's ``limit`` (``requests`` or ``tokens`` per minute) of
    ``value`` is reached, until ``retry_after_s`` from now; for tokens, what the call would
    have reserved and what was left of the limit."""

    limit: str
    value: int
    retry_after_s: int
    reserved_tokens: int | None = None
    left_tokens: int | None = None


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

    def admit(self, limits: RateLimits, now: float, tokens: int = 0) -> Ticket | Refusal:
        """Count a call of the key at ``now`` that may use ``tokens`` (its estimate; reserved
        capped at ``tpm``), or the limit it does not fit (the requests' first)."""
        window = window_of(now)
        used = self.used(limits.key_id, window)
        if limits.rpm is not None and used.requests >= limits.rpm:
            return Refusal("requests", limits.rpm, retry_after_s(now))
        reserved = max(0, tokens)
        if limits.tpm is not None:
            reserved = min(reserved, limits.tpm)
            if used.tokens >= limits.tpm or used.tokens + reserved > limits.tpm:
                left = max(0, limits.tpm - used.tokens)
                return Refusal("tokens", limits.tpm, retry_after_s(now), reserved, left)
        self._count((limits.key_id, window), 1, reserved)
        return Ticket(limits.key_id, window, reserved)

    def release(self, ticket: Ticket) -> None:
        """Give back an admitted call that did not run (refused further on): its request and
        its reservation."""
        self._count((ticket.key_id, ticket.window), -1, -ticket.reserved_tokens)

    def settle(self, ticket: Ticket, tokens: int) -> None:
        """An admitted call ended, charged ``tokens`` (:func:`charge`): its reservation becomes
        that, in the window it was admitted in."""
        change = max(0, tokens) - ticket.reserved_tokens
        if change:
            self._count((ticket.key_id, ticket.window), 0, change)

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


@dataclass
class Progress:
    """What the proxy saw of a call while it ran (proxy/callpath/runner.py keeps it): its
    prompt (the proxy's estimate) and output limit, whether it streams, whether its first
    token came, and the output tokens that came (the first included)."""

    prompt_tokens: int
    output_limit_tokens: int
    streamed: bool
    started: bool = False
    output_tokens: int = 0

    def produced(self, tokens: int) -> None:
        """``tokens`` more output tokens came (the first token included: ``started``)."""
        self.started = True
        self.output_tokens += tokens


def charge(progress: Progress, *, finished_tokens: int | None, cancelled: bool) -> int:
    """The tokens a call that ended is charged (module docstring, "What a call is charged"):
    ``finished_tokens`` (the engine's prompt + output) when it finished; else, before its first
    token, its prompt if ``cancelled`` and nothing if it failed; after it, its prompt plus the
    output streamed, or its output limit when it was not streamed."""
    if finished_tokens is not None:
        return finished_tokens
    if not progress.started:
        return progress.prompt_tokens if cancelled else 0
    output = progress.output_tokens if progress.streamed else progress.output_limit_tokens
    return progress.prompt_tokens + output
