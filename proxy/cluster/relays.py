"""The calls this replica relays to their owner replicas, and the watch that ends a relay
whose owner is gone instead of letting it hang.

A relay waits for its owner in :meth:`Relay.waiting` scopes: the owner's response headers,
then each chunk of its body. Once a round (:data:`WATCH_S`) the watch

- aborts every relay whose owner left the live set (membership: not heard from within
  ``replica_ttl_s``, or left; a peer only marked down after a failed connect keeps its
  relays, which end on their own if it is dead);
- probes ``GET /healthz`` of each owner that has a relay waiting longer than a round: one
  that does not answer 200 within :data:`PROBE_TIMEOUT_S` is marked down (new calls go to
  the next owner) and its relays are aborted.

So a relay to an owner that stopped (SIGSTOP, a hung process, a partition) ends within
about 2 × WATCH_S + PROBE_TIMEOUT_S (≈ 4 s), whatever the call's length; one to a live
owner runs as long as the call takes (up to the read timeout between bytes). The drain
(proxy/callpath/shutdown.py) aborts every relay at once (:meth:`Relays.abort_all`). An aborted relay
raises its :class:`~talaria.proxy.contract.errors.ApiError` (a 503) out of its scope, at once or at
its next wait.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from types import TracebackType

import aiohttp

from talaria.proxy.cluster.membership import Membership
from talaria.proxy.contract.errors import ApiError

log = logging.getLogger("talaria.proxy.cluster")

WATCH_S = 1.0
"""How often the watch looks at the relays in flight (s)."""
PROBE_TIMEOUT_S = 2.0
"""How long an owner's /healthz may take before its relays are aborted (s)."""


class Relay:
    """One call in flight to replica ``target`` (at ``url``)."""

    __slots__ = ("__weakref__", "_scope", "error", "since", "target", "url")

    def __init__(self, target: str, url: str) -> None:
        self.target, self.url = target, url
        self.since = time.monotonic()
        self.error: ApiError | None = None
        self._scope: asyncio.Timeout | None = None

    def waiting(self) -> _Waiting:
        """A scope around one wait for the owner: it raises ``error`` once aborted."""
        return _Waiting(self)

    def abort(self, error: ApiError) -> None:
        """End the relay with ``error``: its wait now, if it waits, else its next one."""
        if self.error is None:
            self.error = error
        if self._scope is not None:
            self._scope.reschedule(0)  # a deadline in the past: fires at the next turn


class _Waiting:
    __slots__ = ("_relay", "_timeout")

    def __init__(self, relay: Relay) -> None:
        self._relay = relay
        self._timeout = asyncio.timeout(None)

    async def __aenter__(self) -> None:
        if self._relay.error is not None:
            raise self._relay.error
        await self._timeout.__aenter__()
        self._relay._scope = self._timeout

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._relay._scope = None
        try:
            await self._timeout.__aexit__(kind, exc, tb)
        except TimeoutError:
            if self._relay.error is None:
                raise
            raise self._relay.error from None


def owner_gone(name: str, why: str) -> ApiError:
    """The 503 of a call whose owner replica failed or stopped answering after it was sent."""
    return ApiError(
        503,
        f"Replica {name}, which holds this session, {why}. The call may or may not have "
        "run there; retry it.",
        type="server_error",
        code="replica_unavailable",
        retry_after_s=1.0,
    )


class Relays:
    """The relays in flight (held weakly: one whose response was dropped unread goes too)."""

    def __init__(
        self,
        membership: Membership,
        http: Callable[[], aiohttp.ClientSession],
        *,
        watch_s: float = WATCH_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self._membership = membership
        self._http = http
        self._watch_s, self._probe_timeout_s = watch_s, probe_timeout_s
        self._relays: weakref.WeakSet[Relay] = weakref.WeakSet()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the watch: one :meth:`check` every ``watch_s`` seconds."""
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        """Stop the watch (the relays in flight are left as they are)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def open(self, target: str, url: str) -> Relay:
        """A new relay to replica ``target`` at ``url``, watched until :meth:`close`."""
        relay = Relay(target, url)
        self._relays.add(relay)
        return relay

    def close(self, relay: Relay) -> None:
        """Stop watching ``relay`` (its call is done, or was never sent)."""
        self._relays.discard(relay)

    def abort_all(self, error: Callable[[], ApiError]) -> int:
        """Abort every relay in flight, each with its own ``error()``; returns how many."""
        relays = list(self._relays)
        for relay in relays:
            relay.abort(error())
        return len(relays)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._watch_s)
            try:
                await self.check()
            except Exception as exc:  # never let the watch die
                log.warning("watching the relays failed: %r", exc)

    async def check(self) -> None:
        """One round of the watch (module docstring)."""
        live = self._membership.peers
        waited = time.monotonic() - self._watch_s
        slow: dict[str, str] = {}
        for relay in list(self._relays):
            if relay.target not in live:
                relay.abort(owner_gone(relay.target, "left the live replicas"))
            elif relay.since <= waited:
                slow[relay.target] = relay.url
        if not slow:
            return
        answers = await asyncio.gather(*(self._answers(url) for url in slow.values()))
        for name, ok in zip(slow, answers, strict=True):
            if ok:
                continue
            log.warning(
                "replica %s did not answer /healthz within %g s: aborting the calls relayed to it",
                name,
                self._probe_timeout_s,
            )
            self._membership.mark_down(name)
            why = f"did not answer its /healthz within {self._probe_timeout_s:g} s"
            for relay in list(self._relays):
                if relay.target == name:
                    relay.abort(owner_gone(name, why))

    async def _answers(self, url: str) -> bool:
        timeout = aiohttp.ClientTimeout(total=self._probe_timeout_s)
        try:
            async with self._http().get(url + "/healthz", timeout=timeout) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False
