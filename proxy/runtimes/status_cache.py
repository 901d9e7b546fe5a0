"""A runtime's status for routing, fetched at most once at a time and mostly off the call path.

Ages are loop seconds since the status was fetched:

- ``age ≤ ttl_s``: the cached status, nothing fetched;
- ``ttl_s < age ≤ ttl_s + stale_s``: the cached status at once, and one refresh in the
  background (*stale-while-revalidate*); under load the refreshes keep the age within
  ``ttl_s`` plus one fetch, and no call waits for one;
- older, none yet, or the last refresh failed: the caller awaits a fetch.

Concurrent callers share the fetch in flight (*single flight*): however many calls arrive while
a status is stale, the runtime answers one request. A background refresh that fails forgets
the cached status, so the next caller awaits a fetch and sees the failure (the pool then
leaves that runtime out of the decision). ``ttl_s == 0`` turns caching off: every caller
fetches its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from talaria.core.status import InstanceStatus

log = logging.getLogger("talaria.proxy.runtimes")

Fetch = Callable[[], Awaitable[InstanceStatus]]


class StatusCache:
    """The status of one runtime, fetched by ``fetch`` (module docstring)."""

    def __init__(
        self,
        fetch: Fetch,
        *,
        ttl_s: float,
        stale_s: float,
        now: Callable[[], float] | None = None,
    ) -> None:
        """``now``: seconds on a monotonic clock (default: the running loop's time)."""
        self._fetch = fetch
        self._now = now or (lambda: asyncio.get_running_loop().time())
        self._ttl_s = ttl_s
        self._stale_s = stale_s
        self._status: InstanceStatus | None = None
        self._at = 0.0
        self._inflight: asyncio.Task[InstanceStatus] | None = None
        self.fetches = 0  # how many fetches were started (for tests and benchmarks)

    def put(self, status: InstanceStatus) -> None:
        """Take ``status`` as fetched now (the runtime's first answer)."""
        self._status = status
        self._at = self._now()

    async def get(self) -> InstanceStatus:
        """The status, as the module docstring says; raises what the fetch raised."""
        if self._ttl_s <= 0:
            self.fetches += 1
            return await self._fetch()
        age = self._now() - self._at
        if self._status is not None and age <= self._ttl_s:
            return self._status
        if self._status is not None and age <= self._ttl_s + self._stale_s:
            self._refresh()
            return self._status
        return await asyncio.shield(self._refresh())

    def _refresh(self) -> asyncio.Task[InstanceStatus]:
        """The fetch in flight, or a new one."""
        if self._inflight is None:
            self.fetches += 1
            self._inflight = asyncio.get_running_loop().create_task(self._fetch_and_keep())
            self._inflight.add_done_callback(_log_failure)
        return self._inflight

    async def _fetch_and_keep(self) -> InstanceStatus:
        started = self._now()
        try:
            status = await self._fetch()
        except BaseException:
            self._status = None  # the next caller awaits a fetch and sees it fail
            raise
        finally:
            self._inflight = None
        self._status, self._at = status, started
        return status

    async def close(self) -> None:
        """Cancel the fetch in flight, if any."""
        task, self._inflight = self._inflight, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _log_failure(task: asyncio.Task[InstanceStatus]) -> None:
    """Retrieve a refresh's failure (a background one has no caller to see it) and log it."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("status refresh failed: %r", exc)
