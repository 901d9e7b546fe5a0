"""The event loop's lag, measured from inside the loop, and the proxy served in this process with
such a probe in its loop (bench/loop_lag.py, tests/integration/test_loop_lag.py).

:class:`LagProbe` is a task that sleeps ``interval_s`` again and again: each wake-up later than
it asked for is lag, the time the loop spent on something else without yielding (a callback,
a coroutine's step between two awaits). ``worst_s`` is the largest lag since the last reset.
core/loop_watchdog.py's heartbeat (0.25 s, read from a thread) cannot tell blocks shorter than
its interval; this probe sees any block longer than about ``interval_s``.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROBE_INTERVAL_S = 0.001


class LagProbe:
    """Measures one loop's lag (module docstring); run :meth:`run` as a task of that loop."""

    def __init__(self, interval_s: float = PROBE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.worst_s = 0.0

    async def run(self) -> None:
        """Sleep ``interval_s`` for ever, noting how late each wake-up comes."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.worst_s = max(self.worst_s, loop.time() - due)

    async def reset(self) -> None:
        """Forget the worst lag so far (run on the probe's loop: between two of its wake-ups)."""
        self.worst_s = 0.0


@dataclass
class InProcessProxy:
    """A proxy served on a thread of this process, with a :class:`LagProbe` in its loop."""

    base_url: str
    probe: LagProbe
    loop: asyncio.AbstractEventLoop
    max_request_bytes: int
    """The proxy's body limit (``TALARIA_MAX_REQUEST_BYTES``)."""

    def reset(self) -> None:
        """Forget the probe's worst lag (waits for the loop to run the reset)."""
        asyncio.run_coroutine_threadsafe(self.probe.reset(), self.loop).result()

    def worst_lag_s(self) -> float:
        """The probe's worst lag since the last reset, read on the loop (after whatever the
        loop had queued before this call)."""

        async def read() -> float:
            return self.probe.worst_s

        return asyncio.run_coroutine_threadsafe(read(), self.loop).result()


@contextmanager
def proxy_in_thread(**settings: Any) -> Iterator[InProcessProxy]:
    """``talaria serve``'s app and server (its bounded HTTP edge, uvloop when installed, the
    start-up objects frozen out of the collector's reach) on a free loopback port, on a
    thread of this process, SQLite in a temporary folder; ``settings``: ProxySettings
    fields. The freeze takes every object of this process: a test process that needs them
    back calls ``gc.unfreeze()`` after. Stops as ``talaria serve`` does (the drain)."""
    from talaria.core.http_edge import BoundedConfig, EdgeBounds
    from talaria.proxy.contract.settings import ProxySettings
    from talaria.proxy.edge.app import create_app
    from talaria.proxy.edge.serve import DrainingServer

    probe = LagProbe()
    started = threading.Event()
    loops: list[asyncio.AbstractEventLoop] = []
    tasks: list[asyncio.Task[None]] = []  # held: a loop keeps only weak references to tasks

    class ProbedServer(DrainingServer):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            loops.append(asyncio.get_running_loop())
            tasks.append(loops[0].create_task(probe.run()))
            started.set()

    with tempfile.TemporaryDirectory() as folder:
        config = ProxySettings(
            **{
                "database_url": f"sqlite+aiosqlite:///{Path(folder) / 'lag.db'}",
                "freeze_gc": True,
                **settings,
            }
        )
        app = create_app(config)
        uvicorn_config = BoundedConfig(
            app, EdgeBounds(), host="127.0.0.1", port=0, log_level="warning", lifespan="on"
        )
        server = ProbedServer(uvicorn_config, app)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        if not started.wait(timeout=120):
            raise RuntimeError("the proxy did not start")
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            yield InProcessProxy(
                f"http://127.0.0.1:{port}", probe, loops[0], config.max_request_bytes
            )
        finally:
            server.begin_drain()
            server.should_exit = True
            thread.join(timeout=config.drain_timeout_s + 30)
