"""Shutting down within ``drain_timeout_s`` (D), losing nothing.

On SIGTERM / SIGINT (``talaria serve``, proxy/edge/serve.py, calls :meth:`Shutdown.begin`):

1. uvicorn stops accepting connections and closes idle ones; calls in flight go on.
2. At D − R (R = :func:`flush_reserve_s`), the calls still running are aborted: each client
   gets a 503 "shutting down, retry" (an error event in a stream), each call an error record.
   So are the calls a replica still relays to their owners (proxy/cluster/forward.py).
3. The lifespan's shutdown (:meth:`Shutdown.finish`) closes the gateway, then gives the writer
   what is left until D to commit the queue. Records it cannot write by then (the database is
   down) are spilled to the dead-letter file, never dropped.

uvicorn's own graceful timeout is set to D − R/2 as a backstop (it cancels the HTTP handlers
of connections that are still open then). Without :meth:`begin` (tests, or an app under another
server), :meth:`finish` starts the clock itself: calls get D − R, the writer the rest.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from talaria.proxy.callpath.gateway import Gateway
from talaria.proxy.store.deadletters import DeadLetters
from talaria.proxy.store.writer import BatchWriter

log = logging.getLogger("talaria.proxy")


def flush_reserve_s(drain_timeout_s: float) -> float:
    """R: the part of the drain timeout kept for committing records, min(5 s, D / 4)."""
    return min(5.0, drain_timeout_s / 4)


class Shutdown:
    """The drain of one proxy within ``drain_timeout_s`` (D, wall seconds): the module
    docstring's steps."""

    def __init__(
        self,
        gateway: Gateway,
        writer: BatchWriter,
        dead_letters: DeadLetters,
        drain_timeout_s: float,
        leave: Callable[[], Coroutine[Any, Any, None]] | None = None,
        relays: Callable[[], int] | None = None,
    ) -> None:
        """``leave``: run when the drain begins (a replica leaves its peers, so that they
        stop forwarding calls to it). ``relays``: aborts the calls a replica relays to its
        peers, with the same 503; returns how many."""
        self._gateway = gateway
        self._leave = leave
        self._relays = relays
        self._leaving: asyncio.Task[None] | None = None
        self._writer = writer
        self._dead_letters = dead_letters
        self.drain_timeout_s = drain_timeout_s
        self._began_at: float | None = None
        self._abort: asyncio.TimerHandle | None = None

    @property
    def draining(self) -> bool:
        """Whether shutdown has begun (``/readyz`` then says not ready)."""
        return self._began_at is not None

    def begin(self) -> None:
        """Shutdown was requested: start the drain clock (idempotent)."""
        if self._began_at is not None:
            return
        self._began_at = time.monotonic()
        calls_get = self.drain_timeout_s - flush_reserve_s(self.drain_timeout_s)
        log.info(
            "shutting down: %d calls in flight get %.1f s, then the store the rest of %.1f s",
            self._gateway.inflight,
            calls_get,
            self.drain_timeout_s,
        )
        self._gateway.refuse_new_calls()
        loop = asyncio.get_running_loop()
        self._abort = loop.call_later(calls_get, self._abort_calls)
        if self._leave is not None:
            self._leaving = loop.create_task(self._leave())

    def _abort_calls(self) -> None:
        aborted = self._gateway.abort_calls()
        if self._relays is not None:
            aborted += self._relays()
        if aborted:
            log.warning("drain timeout: aborted %d calls still running (503 to clients)", aborted)

    async def finish(self) -> None:
        """Close the gateway and the writer within what is left of the drain timeout; spill
        what could not be written."""
        self.begin()
        assert self._began_at is not None
        reserve = flush_reserve_s(self.drain_timeout_s)
        left = self.drain_timeout_s - (time.monotonic() - self._began_at)
        await self._gateway.close(timeout_s=max(0.0, left - reserve))
        if self._leaving is not None:
            await asyncio.gather(self._leaving, return_exceptions=True)
        if self._abort is not None:
            self._abort.cancel()
        left = self.drain_timeout_s - (time.monotonic() - self._began_at)
        unwritten = await self._writer.close(timeout_s=max(left, 0.5))
        if unwritten:
            error = repr(self._writer.last_error) if self._writer.last_error else "drain timeout"
            path = await asyncio.to_thread(
                self._dead_letters.spill, unwritten, "unwritten at shutdown", error
            )
            log.error(
                "the store could not take %d records before the drain timeout; kept in %s",
                len(unwritten),
                path,
            )
