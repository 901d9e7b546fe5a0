"""``serve(app, ...)``: uvicorn as ``talaria serve`` runs it, with the drain of
proxy/callpath/shutdown.py.

uvicorn's graceful-shutdown timeout alone would cut the connections of calls still running at
the deadline (their clients get no answer). So the server tells the proxy when a shutdown
signal arrives (:meth:`DrainingServer.begin_drain` → ``Shutdown.begin``), and the proxy answers
those calls with a 503 before uvicorn's backstop, D − R/2, fires. The signal also arms an exit
deadline at D + ``EXIT_GRACE_S`` (core/loop_watchdog.py): a process whose loop is blocked, or
whose drain does not end, is ended then.
"""

from __future__ import annotations

import asyncio
import math
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from talaria.core.http_edge import BoundedConfig, EdgeBounds
from talaria.core.loop_watchdog import ExitDeadline
from talaria.proxy.callpath.shutdown import flush_reserve_s

EXIT_GRACE_S = 5.0
"""After the drain timeout, what the lifespan's last steps (spilling records to the dead-letter
file, closing clients) and the interpreter's exit get before the process is ended."""


def backstop_s(drain_timeout_s: float) -> int:
    """uvicorn's graceful-shutdown timeout: D − R/2 rounded up to whole seconds (uvicorn takes
    an int), so it is always later than the proxy's own abort at D − R."""
    return max(1, math.ceil(drain_timeout_s - flush_reserve_s(drain_timeout_s) / 2))


class DrainingServer(uvicorn.Server):
    """A uvicorn server that starts the proxy's drain when it is told to exit. ``proxy``:
    the app of ``create_app`` (``config.app`` may wrap it)."""

    def __init__(
        self, config: uvicorn.Config, proxy: FastAPI, drain_timeout_s: float | None = None
    ) -> None:
        """``drain_timeout_s``: arm the exit deadline at this + ``EXIT_GRACE_S`` on a
        shutdown signal (None: no deadline)."""
        super().__init__(config)
        self._proxy = proxy
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit_after_s = None if drain_timeout_s is None else drain_timeout_s + EXIT_GRACE_S
        self._deadline = ExitDeadline()

    async def startup(self, sockets: Any = None) -> None:
        """uvicorn's start-up, remembering the running loop (the drain is scheduled on it)."""
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The signal handler: arm the exit deadline, let uvicorn stop, begin the drain."""
        if self._exit_after_s is not None:
            self._deadline.arm(self._exit_after_s)
        super().handle_exit(sig, frame)
        self.begin_drain()

    def begin_drain(self) -> None:
        """Start the proxy's drain clock (safe from any thread, and from a signal handler)."""
        ctx = getattr(self._proxy.state, "talaria", None)
        if ctx is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(ctx.shutdown.begin)


def serve(
    app: FastAPI,
    host: str,
    port: int,
    log_level: str,
    drain_timeout_s: float,
    bounds: EdgeBounds,
) -> None:
    """Run ``app`` until SIGTERM / SIGINT, then drain within ``drain_timeout_s``; its
    connections under ``bounds`` (core/http_edge.py)."""
    config = BoundedConfig(
        app,
        bounds,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=backstop_s(drain_timeout_s),
    )
    DrainingServer(config, app, drain_timeout_s).run()
