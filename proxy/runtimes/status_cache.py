"""A runtime's status for routing, fetched at most once at a time and mostly off the call path.

Ages are loop seconds since the status was fetched:

- ``age ≤ ttl_s``: the cached status, nothing fetched;
- ``ttl_s < age ≤ ttl_s + stale_s``: the cached status at once, and one refresh in the
  background (*stale-while-revalidate*); under load the refreshes keep the age within
  ``ttl_s`` plus one fetch, and no call waits for one;
- older, or none yet: the caller awaits a fetch;
- the last fetch failed, or a call found the runtime unreachable (``failed``): the caller gets
  that failure at once (the pool leaves the runtime
  out of the decision), and one fetch retries in the background; the first to succeed is the
  status again. A runtime that stops answering (a SIGSTOPped or wedged process, a network
  partition) thus costs the calls routed while it is down nothing but its absence: only the
  fetch that found it down waited, for its timeout (http.py ``STATUS_TIMEOUT_S``). Before,
  every call awaited its own fetch of it, and with a long read timeout one stopped runtime
  held every replica's calls for as long as it was stopped (tests/e2e/test_chaos.py found it).

Concurrent callers share the fetch in flight (*single flight*): however many calls arrive while
a status is stale, the runtime answers one request. ``ttl_s == 0`` turns caching off: every
caller fetches its own.
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
        name: str = "",
    ) -> None:
        """``now``: seconds on a monotonic clock (default: the running loop's time); ``name``:
        the runtime's, for the log."""
        self._fetch = fetch
        self._name = name
        self._now = now or (lambda: asyncio.get_running_loop().time())
        self._ttl_s = ttl_s
        self._stale_s = stale_s
        self._status: InstanceStatus | None = None
        self._at = 0.0
        self._failure: Exception | None = None
        """The last fetch's failure, until a fetch succeeds."""
        self._inflight: asyncio.Task[InstanceStatus] | None = None
        self.fetches = 0  # how many fetches were started (for tests and benchmarks)

    def put(self, status: InstanceStatus) -> None:
        """Take ``status`` as fetched now (the runtime's first answer)."""
        self._status = status
        self._at = self._now()

    def failed(self, exc: Exception) -> None:
        """A call could not reach the runtime: callers get ``exc`` at once (the pool leaves
        the runtime out) until a fetch succeeds; one fetch retries in the background."""
        if self._failure is None:
            log.warning("runtime %s: unreachable, left out until it answers: %r", self._name, exc)
        self._status, self._failure = None, exc
        if self._ttl_s > 0:
            self._refresh()

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
        if self._failure is not None:
            self._refresh()
            raise self._failure
        return await asyncio.shield(self._refresh())

    def _refresh(self) -> asyncio.Task[InstanceStatus]:
        """The fetch in flight, or a new one."""
        if self._inflight is None:
            self.fetches += 1
            self._inflight = asyncio.get_running_loop().create_task(self._fetch_and_keep())
            self._inflight.add_done_callback(_retrieve)
        return self._inflight

    async def _fetch_and_keep(self) -> InstanceStatus:
        started = self._now()
        try:
            status = await self._fetch()
        except Exception as exc:
            if self._failure is None:
                log.warning("runtime %s: status failed, left out until it answers: %r",
                            self._name, exc)  # fmt: skip
            self._status, self._failure = None, exc  # callers fail fast until one succeeds
            raise
        finally:
            self._inflight = None
        if self._failure is not None:
            log.warning("runtime %s: status answers again", self._name)
        self._status, self._at, self._failure = status, started, None
        return status

    async def close(self) -> None:
        """Cancel the fetch in flight, if any."""
        task, self._inflight = self._inflight, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _retrieve(task: asyncio.Task[InstanceStatus]) -> None:
    """Retrieve a fetch's failure (a background one has no caller to see it; the cache logs
    when a runtime starts and stops failing)."""
    if not task.cancelled():
        task.exception()
