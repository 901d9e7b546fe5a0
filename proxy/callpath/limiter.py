"""``RateLimiter``: the API keys' per-minute limits on calls and tokens (``talaria keys create
--rpm --tpm``), enforced across replicas through the store without a database round trip per
call. The proxy's ``limits`` service (proxy/edge/services.py).

- **Before a call** (proxy/callpath/door.py ``open_call``, on the replica that runs it, after
  the body is read): a key past its calls, or whose tokens left do not hold the call's
  reservation (its prompt as the proxy counts it + its output limit), gets 429
  ``rate_limit_exceeded`` with ``Retry-After`` until its minute ends, in the API's own
  envelope; otherwise the call and its reservation are counted (and given back if it is
  refused further on, before it runs).
- **When a call ends**, however it ends (finished, failed, cancelled by its client or by the
  shutdown: proxy/callpath/runner.py), its reservation settles to what it is charged: the
  engine's count of its tokens, or for a call that did not finish what the proxy saw the
  engine process (proxy/callpath/limits.py ``charge``).
- **Every** ``TALARIA_RATE_SYNC_S`` (1 s): this replica's counts since the last sync are added
  to the store's (``key_usage``: proxy/store/usage.py, one atomic upsert) and the minute's
  totals of every key read back; once a minute the rows of older minutes are deleted. At start
  the totals are read once, at the drain the last counts are flushed.
- **Store down:** calls are limited on what this replica knows (the last totals read and its
  own counts since); its counts wait for the next sync that works. Logged once, and once more
  when the store answers again.

The windows, the counts and the bound on how far several replicas together can pass a limit
(by at most one sync interval of the key's calls through each other replica) are in
proxy/callpath/limits.py. Keys without limits are not counted at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Protocol

from talaria.proxy.callpath.limits import KEPT_WINDOWS, WINDOW_S, RateBook, Ticket, window_of
from talaria.proxy.contract.calls import RateLimits
from talaria.proxy.contract.errors import rate_limited

log = logging.getLogger("talaria.proxy.callpath.limiter")

DEFAULT_SYNC_S = 1.0
"""How often a replica syncs its counts with the store by default (``TALARIA_RATE_SYNC_S``)."""
STORE_TIMEOUT_S = 5.0
"""A sync that takes longer counts as failed (its counts are sent again with the next): a
store that hangs can neither hold the proxy's start or drain nor stop the counting. A sync
whose transaction committed but whose answer came too late is counted twice: the limits err
on the side of refusing."""


class UsageStore(Protocol):
    """What the limiter needs of the store (``UsageTable``, proxy/store/usage.py, has it)."""

    async def add_usage(
        self, added: Mapping[tuple[str, datetime], tuple[int, int]], window: datetime
    ) -> dict[str, tuple[int, int]]:
        """Add the counts atomically; the totals of ``window`` by key id."""
        ...

    async def forget_usage_before(self, cutoff: datetime) -> int:
        """Delete the counts of windows that began before ``cutoff``."""
        ...


def _at(window: int) -> datetime:
    return datetime.fromtimestamp(window, UTC)


class RateLimiter:
    """The keys' rate limits on this replica (module docstring). ``clock``: wall seconds since
    the epoch (``time.time``; the windows are UTC minutes, shared by every replica)."""

    def __init__(
        self,
        store: UsageStore,
        *,
        sync_s: float = DEFAULT_SYNC_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._sync_s = sync_s
        self._clock = clock
        self._book = RateBook()
        self._lock = asyncio.Lock()
        self._failing = False
        self._forgotten_before: int | None = None
        self._task: asyncio.Task[None] | None = None

    # -- the call path ------------------------------------------------------------------------
    def admit(self, limits: RateLimits | None, tokens: int = 0) -> Ticket | None:
        """Count a call of a key with ``limits`` that may use ``tokens`` (its reservation;
        None: not limited, nothing counted), or raise its 429 when the key is past its calls
        or the reservation does not fit its tokens left."""
        if limits is None:
            return None
        admitted = self._book.admit(limits, self._clock(), tokens)
        if isinstance(admitted, Ticket):
            return admitted
        reservation = None
        if admitted.reserved_tokens is not None and admitted.left_tokens is not None:
            reservation = (admitted.reserved_tokens, admitted.left_tokens)
        raise rate_limited(admitted.limit, admitted.value, admitted.retry_after_s, reservation)

    def release(self, ticket: Ticket | None) -> None:
        """An admitted call did not run (refused further on): not counted after all."""
        if ticket is not None:
            self._book.release(ticket)

    def settlement(self, ticket: Ticket | None) -> Callable[[int], None] | None:
        """What settles the admitted call's reservation to the tokens it is charged when it
        ends (once: a second settlement is ignored); None when it is not limited."""
        if ticket is None:
            return None
        settled = False

        def settle(tokens: int) -> None:
            nonlocal settled
            if not settled:
                settled = True
                self._book.settle(ticket, tokens)

        return settle

    # -- syncing with the store ---------------------------------------------------------------
    async def sync_once(self) -> bool:
        """Add this replica's counts to the store's and read the minute's totals back; once a
        minute, delete older minutes' rows. False (the counts kept for the next sync) when the
        store cannot be reached."""
        async with self._lock:
            now = self._clock()
            window = window_of(now)
            added = self._book.take(now)
            try:
                totals = await asyncio.wait_for(
                    self._store.add_usage(
                        {(key, _at(w)): (c.requests, c.tokens) for (key, w), c in added.items()},
                        _at(window),
                    ),
                    STORE_TIMEOUT_S,
                )
            except BaseException as exc:
                self._book.failed()
                if not isinstance(exc, Exception):
                    raise
                if not self._failing:
                    log.warning(
                        "cannot sync the API keys' rate limit counts with the store (%r): "
                        "limiting on this replica's own counts until it answers",
                        exc,
                    )
                    self._failing = True
                return False
            self._book.synced(window, totals)
            if self._failing:
                log.warning("the store answers again: rate limit counts synced")
                self._failing = False
            if self._forgotten_before != window:
                await self._forget(window)
            return True

    async def _forget(self, window: int) -> None:
        """Delete the rows of windows before the kept ones (every replica may; at most once a
        minute each)."""
        try:
            cutoff = _at(window - (KEPT_WINDOWS - 1) * WINDOW_S)
            await asyncio.wait_for(self._store.forget_usage_before(cutoff), STORE_TIMEOUT_S)
        except Exception as exc:  # the next minute's sync tries again
            log.debug("deleting old rate limit counts failed: %r", exc)
            return
        self._forgotten_before = window

    async def _sync_every_interval(self) -> None:
        while True:
            await asyncio.sleep(self._sync_s)
            await self.sync_once()

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Read the minute's totals once, then sync every ``sync_s``."""
        await self.sync_once()
        self._task = asyncio.get_running_loop().create_task(self._sync_every_interval())

    async def close(self) -> None:
        """Stop syncing; flush the last counts (the calls drained at shutdown included)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.sync_once()
