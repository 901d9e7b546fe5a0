"""The runtime's serving process: uvicorn serving the app (runtime/server.py) on the asyncio
loop, its request heads and connections bounded (core/http_edge.py), until SIGTERM / SIGINT.

Draining (:func:`serve_runtime`): on SIGTERM uvicorn stops accepting connections and waits up
to the drain timeout D for in-flight requests — streams included — before the lifespan stops
the node and shuts the engines down; readiness reports 503 from then on. The signal also arms
an exit deadline at D + ``ENGINE_SHUTDOWN_S``: a process whose loop is blocked, or whose engines
do not stop, is ended then.
"""

from __future__ import annotations

import math
from types import FrameType

import uvicorn
from fastapi import FastAPI

from talaria.core.http_edge import BoundedConfig, EdgeBounds
from talaria.core.loop_watchdog import ExitDeadline

ENGINE_SHUTDOWN_S = 30.0
"""After the drain timeout, what stopping the node and shutting the engines down gets (vLLM's
engine shutdown takes seconds per engine) before the process is ended."""


class _DeadlineServer(uvicorn.Server):
    """uvicorn that arms an exit deadline when told to exit."""

    def __init__(self, config: uvicorn.Config, exit_after_s: float) -> None:
        super().__init__(config)
        self._exit_after_s = exit_after_s
        self._deadline = ExitDeadline()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._deadline.arm(self._exit_after_s)
        super().handle_exit(sig, frame)


def serve_runtime(
    app: FastAPI, host: str, port: int, log_level: str, drain_timeout_s: float
) -> None:
    """Run the runtime server until SIGTERM / SIGINT, then drain within ``drain_timeout_s``;
    the process ends by ``drain_timeout_s + ENGINE_SHUTDOWN_S`` whatever happens."""
    # loop="asyncio": the scheduler's clock is loop.time(), which uvloop rounds to whole
    # milliseconds; the standard loop reads time.monotonic(), fine enough to time engine steps.
    config = BoundedConfig(
        app,
        EdgeBounds(),
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=max(1, math.ceil(drain_timeout_s)),
        loop="asyncio",
    )
    _DeadlineServer(config, drain_timeout_s + ENGINE_SHUTDOWN_S).run()
