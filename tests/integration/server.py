"""A real proxy on a real socket: uvicorn in a thread, started and stopped around tests."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import uvicorn

from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.dialects.base import Dialect
from talaria.proxy.dialects.registry import DIALECTS
from talaria.proxy.edge.app import create_app
from talaria.proxy.edge.serve import DrainingServer, backstop_s
from talaria.proxy.runtimes.base import RuntimeClient
from tests.support import admin_get


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        await super().startup(sockets)
        self.ready.set()


@dataclass
class RunningProxy:
    base_url: str
    settings: ProxySettings

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"

    def admin(self, path: str) -> Any:
        """GET ``path`` of its admin API with its settings' admin token, as JSON."""
        assert self.settings.admin_token is not None, "the proxy has no admin token"
        return admin_get(self.base_url, self.settings.admin_token, path)


@contextmanager
def running_app(app: Any, lifespan: Literal["on", "off"] = "on") -> Iterator[str]:
    """Serve any ASGI app on a free loopback port (``lifespan``: uvicorn's setting); yields its
    base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan=lifespan)
    server = _Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    if not server.ready.wait(timeout=120):
        raise RuntimeError("server did not start")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


class StatusLog:
    """ASGI middleware that notes (method, path, status) of every HTTP response."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, str, int]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def noting(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.seen.append((scope["method"], scope["path"], message["status"]))
            await send(message)

        await self.app(scope, receive, noting)


class DrainingTestServer(DrainingServer):
    """``talaria serve``'s draining server that says when it listens (``ready``)."""

    def __init__(self, config: uvicorn.Config, proxy: Any) -> None:
        super().__init__(config, proxy)
        self.ready = threading.Event()

    async def startup(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        await super().startup(sockets)
        self.ready.set()


@contextmanager
def running_proxy(
    settings: ProxySettings,
    runtimes: Sequence[RuntimeClient] | None = None,
    statuses: StatusLog | None = None,
    dialects: Sequence[Dialect] = DIALECTS,
) -> Iterator[RunningProxy]:
    """The proxy on a free loopback port; with ``statuses``, every response's status is noted
    there (pass ``StatusLog(None)``: its app is set here). It stops as ``talaria serve`` does
    on SIGTERM: the drain of proxy/callpath/shutdown.py within ``settings.drain_timeout_s``.
    ``dialects``: the APIs it speaks (a test adds its own)."""
    proxy = create_app(settings, runtimes=runtimes, dialects=dialects)
    app: Any = proxy
    if statuses is not None:
        statuses.app = app
        app = statuses
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=backstop_s(settings.drain_timeout_s),
    )
    server = DrainingTestServer(config, proxy)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    if not server.ready.wait(timeout=60):
        raise RuntimeError("proxy did not start")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield RunningProxy(f"http://127.0.0.1:{port}", settings)
    finally:
        server.begin_drain()
        server.should_exit = True
        thread.join(timeout=settings.drain_timeout_s + 30)
