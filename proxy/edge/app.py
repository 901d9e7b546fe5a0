"""The proxy application: ``create_app(settings)``. Its lifespan starts the proxy's services in
dependency order and stops them in the reverse one (proxy/edge/services.py declares them,
proxy/edge/lifecycle.py runs them); the app mounts the dialects' routes, the model list, the
session hints and ends, the admin API and the console, and serves health and metrics."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from talaria.core.body_deadline import BodyDeadline
from talaria.core.clock import Clock, LoopClock
from talaria.proxy.api import admin, sessions
from talaria.proxy.api import models as models_api
from talaria.proxy.callpath.context import context, json_response
from talaria.proxy.console import routes as console
from talaria.proxy.console.auth import ConsoleAuth
from talaria.proxy.contract.peer import trusted_networks
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.dialects.base import Dialect
from talaria.proxy.dialects.registry import DIALECTS
from talaria.proxy.edge.http import (
    RequestIdMiddleware,
    declare_request_models,
    install_error_handlers,
)
from talaria.proxy.edge.lanes import ASGIApp, ProxyApp
from talaria.proxy.edge.lifecycle import Lifecycle
from talaria.proxy.edge.peer import PeerAddress
from talaria.proxy.edge.services import context_of, declare
from talaria.proxy.edge.settings import check_settings
from talaria.proxy.runtimes.base import RuntimeClient
from talaria.proxy.sessions.identity import session_sources
from talaria.proxy.sessions.normalise import prompt_parts

log = logging.getLogger("talaria.proxy")


def freeze_startup_objects() -> None:
    """Move every object alive after start-up (modules, the app, the catalog) out of the
    cyclic collector's reach (``gc.freeze``). Otherwise each full collection walks them all:
    on the 2-core box that was a 45 ms stall of the event loop every few seconds under load,
    most of the p99 latency (docs/proxy-overhead.md)."""
    gc.collect()
    gc.freeze()


def create_app(
    settings: ProxySettings | None = None,
    *,
    runtimes: Sequence[RuntimeClient] | None = None,
    clock: Clock | None = None,
    dialects: Sequence[Dialect] = DIALECTS,
    call_lanes: bool = True,
    wall_clock: Callable[[], float] = time.time,
) -> FastAPI:
    """The proxy. Without ``runtimes`` it builds the embedded simulated node(s) of
    ``settings``; without ``clock`` it uses the loop's time × ``settings.time_scale``;
    ``dialects``: the APIs it speaks (proxy/dialects/registry.py); ``call_lanes``: their
    call routes served around FastAPI's routing (proxy/edge/lanes.py; False: through it, as the
    lanes' equivalence test compares); ``wall_clock``: seconds since the epoch, whose UTC minutes
    are the API keys' rate limit windows (a test's fixed time)."""
    cfg = settings or ProxySettings()
    session_sources(cfg.session_headers)  # a bad TALARIA_SESSION_HEADERS: ValueError naming it
    prompt_parts(cfg.prompt_patterns)  # a bad TALARIA_PROMPT_PATTERNS: ValueError naming it
    check_settings(cfg, dialects)  # a plugin's bad setting (placement's, a dialect's): ValueError

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        life = Lifecycle()
        the_clock = clock or LoopClock(cfg.time_scale)
        declare(
            life, cfg, runtimes=runtimes, clock=the_clock, dialects=dialects, wall_clock=wall_clock
        )
        parts = await life.start()  # each service after what it needs (proxy/edge/services.py)
        app.state.talaria = context_of(cfg, parts)
        app.state.dialect_services = parts.get("dialects", dict)
        if cfg.freeze_gc:
            freeze_startup_objects()
        try:
            yield
        finally:
            await life.stop()  # the reverse order: the drain first, the store last

    app = ProxyApp(
        title="Talaria proxy",
        description="OpenAI-compatible, session-aware gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )

    proxies = trusted_networks(cfg.trusted_proxies)

    def edge(inner: ASGIApp) -> ASGIApp:
        """What every request meets around its route (outermost first)."""
        deadline = BodyDeadline(RequestIdMiddleware(inner), timeout_s=cfg.body_timeout_s)
        return PeerAddress(deadline, proxies)

    app.add_middleware(RequestIdMiddleware)  # FastAPI's stack: the same edge, in this order
    app.add_middleware(BodyDeadline, timeout_s=cfg.body_timeout_s)
    app.add_middleware(PeerAddress, networks=proxies)
    app.state.dialects = tuple(dialects)
    for dialect in dialects:
        app.include_router(dialect.router)
    app.include_router(models_api.router)
    app.include_router(sessions.router)
    app.include_router(admin.router)
    app.include_router(console.router)
    app.mount("/console/static", console.static_files(), name="console-static")
    app.state.console_auth = ConsoleAuth(cfg.admin_token) if cfg.admin_token else None
    install_error_handlers(app)
    declare_request_models(app)
    if call_lanes:
        app.open_lanes((r for d in dialects for r in d.router.routes), edge)

    @app.get("/healthz")
    async def healthz(request: Request) -> Response:
        """Liveness: the process serves HTTP and its event loop has not been blocked for
        ``loop_stall_s`` within the last minute (else 503 with how long, and when)."""
        ctx = context(request)
        loop = ctx.watchdog.health()
        body = {
            "ok": loop["ok"],
            "loop": loop,
            "instances": [r.name for r in ctx.pool.runtimes],
        }
        return json_response(body, 200 if loop["ok"] else 503)

    @app.get("/readyz")
    async def readyz(request: Request) -> Response:
        """Readiness: not shutting down, the store takes writes (its SQLite file is still
        the one opened), and some runtime instance answers (``failed``: why the others do
        not, e.g. a node whose scheduling loop ended). 503 with the failing checks."""
        ctx = context(request)
        pool = ctx.pool
        reachable = await pool.reachable()
        runtimes = {"ok": bool(reachable), "reachable": reachable, "failed": pool.failures}
        checks: dict[str, Any] = {
            "shutdown": {"ok": not ctx.shutdown.draining},
            "store": await ctx.stored.readiness(),
            "runtimes": runtimes,
        }
        if ctx.cluster is not None:  # informative: a replica serves alone too
            checks["replicas"] = {"ok": True, "peers": sorted(ctx.cluster.membership.peers)}
        ready = all(check["ok"] for check in checks.values())
        return json_response({"ready": ready, "checks": checks}, 200 if ready else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        ctx = context(request)
        ctx.auth.check_metrics(request.headers.get("authorization"))
        ctx.metrics.writer_pending.set(ctx.writer.pending)
        return Response(ctx.metrics.render(), media_type="text/plain; version=0.0.4")

    return app
