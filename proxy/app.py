"""The proxy application: ``create_app(settings)``; the lifespan owns the database engine, the
batched writer, the runtime clients and the gateway."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from talaria.core.body_deadline import BodyDeadline, BodyTimeout
from talaria.core.catalog import CatalogError, load_catalog
from talaria.core.clock import Clock, LoopClock
from talaria.core.loop_watchdog import LoopWatchdog
from talaria.proxy.api import admin, anthropic, openai
from talaria.proxy.api import responses as responses_api
from talaria.proxy.api.context import ProxyContext, context, json_response
from talaria.proxy.auth import Authenticator
from talaria.proxy.cluster import trust
from talaria.proxy.cluster.forward import Cluster, Forwarded
from talaria.proxy.cluster.handoff import AdoptableSession
from talaria.proxy.cluster.membership import Membership
from talaria.proxy.console import routes as console
from talaria.proxy.console.auth import ConsoleAuth
from talaria.proxy.dialects.anthropic import error_body as anthropic_error
from talaria.proxy.errors import ApiError
from talaria.proxy.gateway import Gateway
from talaria.proxy.metrics import ProxyMetrics
from talaria.proxy.records import InstanceRecord
from talaria.proxy.responses_store import ResponseStore
from talaria.proxy.runtimes.base import RuntimeClient
from talaria.proxy.runtimes.embedded import build_embedded
from talaria.proxy.runtimes.http import HttpRuntime
from talaria.proxy.settings import ProxySettings
from talaria.proxy.shutdown import Shutdown
from talaria.proxy.store.db import default_url, sqlite_path
from talaria.proxy.store.repository import SqlStore
from talaria.proxy.store.service import StoreService

log = logging.getLogger("talaria.proxy")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class RequestIdMiddleware:
    """Gives every request an id (``request.state.request_id``) and every response the
    ``x-request-id`` header — errors and streams included — and counts every response in
    ``talaria_requests_total`` by route (the path template; "unmatched" for unknown paths,
    so a scanner cannot grow the label set) and status. A request with Talaria's internal
    headers is refused (400) unless it is a peer replica's signed forward (proxy/cluster/
    trust.py), which keeps the peer's request id (``request.state.forward``)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        try:
            forward = _forward(scope)
            refused = None
        except trust.Refused as exc:
            forward, refused = None, ApiError(400, str(exc), code="internal_header")
        request_id = forward.request_id if forward is not None else uuid.uuid4().hex
        state["request_id"], state["forward"] = request_id, forward
        header = (b"x-request-id", request_id.encode())

        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []), header]
                _count(scope, message["status"])
            await send(message)

        if refused is not None:  # before anything runs
            await _error_response(scope["path"], refused)(scope, receive, send_with_id)
            return
        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:  # the client left mid-body: no one to answer, not our error
            log.warning(
                "client went away before its request body arrived: %s %s (request %s)",
                scope["method"],
                scope["path"],
                request_id,
            )
            _count(scope, CLIENT_CLOSED)
        except Exception as exc:  # an error no handler answered: answered here, with the id
            if started:
                raise
            await _error_response(scope["path"], _unexpected(exc))(scope, receive, send_with_id)


CLIENT_CLOSED = 499
"""The status ``talaria_requests_total`` counts for a client that disconnected before its
request's body arrived (nginx's "client closed request"; nothing is sent)."""


def _forward(scope: Scope) -> trust.Forward | None:
    """The peer's verified forward; None for a client's request; ``trust.Refused``."""
    found = trust.internal_headers(scope["headers"])
    if not found:
        return None
    ctx = getattr(scope["app"].state, "talaria", None)
    cluster = ctx.cluster if ctx is not None else None
    path = scope.get("raw_path") or scope["path"].encode()
    return trust.verify(
        found,
        scope["method"],
        path.decode("latin-1"),
        scope.get("query_string", b"").decode("latin-1"),
        cluster.secret if cluster is not None else None,
        time.time(),
    )


def _unexpected(exc: Exception) -> ApiError:
    """The error for an exception nothing else handled. A RecursionError comes from input
    nested deeper than the parsers follow: the client's 400. Anything else is logged: 500."""
    if isinstance(exc, RecursionError):
        return ApiError(400, "The request nests too deeply to be read.")
    log.exception("unexpected error", exc_info=exc)
    return ApiError(500, "Internal error; see the proxy's log.", type="server_error")


def freeze_startup_objects() -> None:
    """Move every object alive after start-up (modules, the app, the catalog) out of the
    cyclic collector's reach (``gc.freeze``). Otherwise each full collection walks them all:
    on the 2-core box that was a 45 ms stall of the event loop every few seconds under load,
    most of the p99 latency (docs/proxy-overhead.md)."""
    gc.collect()
    gc.freeze()


def _count(scope: Scope, status: int) -> None:
    ctx = getattr(scope["app"].state, "talaria", None)
    if ctx is None:  # before start-up finished
        return
    route = scope.get("route")
    path = getattr(route, "path", None) or "unmatched"
    ctx.metrics.requests.labels(path, str(status)).inc()


async def _join_replicas(cfg: ProxySettings, store: SqlStore, gateway: Gateway) -> Cluster | None:
    """With ``replica_url``: join the replicas sharing the database (PostgreSQL only)."""
    if cfg.replica_url is None:
        gateway.set_drained(await store.cluster.drained())  # a drain outlives a restart
        return None
    if sqlite_path(cfg.database_url or default_url()) is not None:
        raise RuntimeError(
            "TALARIA_REPLICA_URL needs a PostgreSQL database shared by the replicas; "
            "SQLite serves one proxy"
        )
    membership = Membership(
        store.cluster,
        cfg.replica_url,
        cfg.replica_url,
        heartbeat_s=cfg.replica_heartbeat_s,
        ttl_s=cfg.replica_ttl_s,
        on_drained=gateway.set_drained,
    )
    await membership.start()

    async def adopt(tenant_id: str, session_id: str) -> AdoptableSession | None:
        found = await store.sessions.open_root_session(tenant_id, session_id)
        if found is None:
            return None
        summary, instance = found
        return AdoptableSession(
            summary.session_key, summary.model, summary.started_at, summary.calls, instance
        )

    gateway.use_replicas(lambda key: membership.owner_of(key) is None, adopt)
    assert cfg.cluster_secret is not None  # ProxySettings requires it with replica_url
    cluster = Cluster(membership, cfg.cluster_secret, cfg.replica_read_timeout_s)
    cluster.start()
    return cluster


STALE_SWEEP_S = 60.0
"""How often a replica ends the sessions no live replica holds (wall seconds)."""


async def _end_stale_sessions(store: SqlStore, cfg: ProxySettings) -> None:
    """Replicas share the store, so none may end all open sessions at start (its peers hold
    some). Instead each ends, now and then, the open sessions whose last call is older than
    the idle timeout plus a sweep: their owner would have ended them already, so the replica
    that held them is gone (reason ``stale``)."""
    while True:
        await asyncio.sleep(STALE_SWEEP_S)
        now = datetime.now(UTC)
        cutoff = now - timedelta(seconds=cfg.session_idle_timeout_s + STALE_SWEEP_S)
        try:
            ended = await store.sessions.end_open_sessions("stale", now, last_call_before=cutoff)
        except Exception as exc:  # the store may be down; try again next time
            log.warning("ending stale sessions failed: %r", exc)
            continue
        if ended:
            log.warning("ended %d sessions no replica holds (reason 'stale')", ended)


PURGE_INTERVAL_S = 600.0
"""How often expired stored responses are deleted (wall seconds)."""


async def _purge_responses(responses: ResponseStore) -> None:
    while True:
        await asyncio.sleep(PURGE_INTERVAL_S)
        try:
            await responses.purge()
        except Exception as exc:  # the store may be down; try again next time
            log.warning("purging stored responses failed: %r", exc)


def create_app(
    settings: ProxySettings | None = None,
    *,
    runtimes: Sequence[RuntimeClient] | None = None,
    clock: Clock | None = None,
) -> FastAPI:
    """The proxy. Without ``runtimes`` it builds the embedded simulated node(s) of
    ``settings``; without ``clock`` it uses the loop's time × ``settings.time_scale``."""
    cfg = settings or ProxySettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stored = await StoreService.open(cfg)
        store, writer = stored.store, stored.writer
        the_clock = clock or LoopClock(cfg.time_scale)
        try:
            catalog = load_catalog(cfg.catalog_path)
        except CatalogError as exc:
            raise RuntimeError(f"cannot load the model catalog: {exc}") from exc
        clients: list[RuntimeClient]
        if runtimes is not None:
            clients = list(runtimes)
        elif cfg.runtimes:
            clients = [HttpRuntime(url, status_ttl_s=cfg.status_ttl_s) for url in cfg.runtimes]
        else:
            clients = list(build_embedded(cfg, catalog, the_clock))
        for client in clients:
            await client.start()
        hosted = {m for c in clients for m in c.models}
        windows = {m: catalog.model(m).context_window_tokens for m in hosted if m in catalog.models}
        metrics = ProxyMetrics()
        gateway = Gateway(
            clients,
            writer,
            metrics,
            the_clock,
            router=cfg.router,
            routing_seed=cfg.routing_seed,
            context_windows=windows,
            max_inflight_per_tenant=cfg.max_inflight_per_tenant,
            max_sessions_per_tenant=cfg.max_sessions_per_tenant,
            session_idle_timeout_s=cfg.session_idle_timeout_s,
            durable=cfg.durability == "commit",
            commit_timeout_s=cfg.commit_timeout_s,
            time_scale=the_clock.scale if isinstance(the_clock, LoopClock) else 1.0,
        )
        gateway.start()
        responses = ResponseStore(
            writer,
            store.responses,
            enabled=cfg.store_responses,
            ttl_s=cfg.responses_ttl_s,
            tenant_quota_bytes=cfg.responses_tenant_quota_bytes,
            max_bytes=cfg.responses_max_bytes,
        )
        await responses.start()  # the storage quota's totals, read before serving
        purger = asyncio.get_running_loop().create_task(_purge_responses(responses))
        auth = Authenticator(
            cfg.api_keys, store.tenants, allow_open=cfg.allow_open, metrics_token=cfg.metrics_token
        )
        await auth.start()  # reads the key mode and warns when it is open
        now = datetime.now(UTC)
        for client in clients:
            record = InstanceRecord(
                client.name, client.kind, client.address, list(client.models), now
            )
            writer.submit(record)
        cluster = await _join_replicas(cfg, store, gateway)
        shutdown = Shutdown(
            gateway,
            writer,
            stored.dead_letters,
            cfg.drain_timeout_s,
            leave=cluster.membership.stop if cluster else None,
            relays=cluster.abort_relays if cluster else None,
        )
        watchdog = LoopWatchdog(stall_s=cfg.loop_stall_s)
        watchdog.start()
        app.state.talaria = ProxyContext(
            cfg,
            gateway,
            store,
            writer,
            metrics,
            auth,
            responses,
            stored,
            shutdown,
            watchdog,
            cluster,
        )
        sweeper = (
            asyncio.get_running_loop().create_task(_end_stale_sessions(store, cfg))
            if cluster
            else None
        )
        if cfg.freeze_gc:
            freeze_startup_objects()
        try:
            yield
        finally:
            for task in (purger, sweeper):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            await responses.close()
            await shutdown.finish()
            watchdog.stop()
            if cluster is not None:
                await cluster.close()
            for client in clients:
                await client.close()
            await stored.close()

    app = FastAPI(
        title="Talaria proxy",
        description="OpenAI-compatible, session-aware gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(BodyDeadline, timeout_s=cfg.body_timeout_s)
    app.include_router(openai.router)
    app.include_router(anthropic.router)
    app.include_router(responses_api.router)
    app.include_router(admin.router)
    app.include_router(console.router)
    app.mount("/console/static", console.static_files(), name="console-static")
    app.state.console_auth = ConsoleAuth(cfg.admin_token) if cfg.admin_token else None
    _install_error_handlers(app)

    @app.get("/healthz")
    async def healthz(request: Request) -> Response:
        """Liveness: the process serves HTTP and its event loop has not been blocked for
        ``loop_stall_s`` within the last minute (else 503 with how long, and when)."""
        ctx = context(request)
        loop = ctx.watchdog.health()
        body = {"ok": loop["ok"], "loop": loop, "instances": [r.name for r in ctx.gateway.runtimes]}
        return json_response(body, 200 if loop["ok"] else 503)

    @app.get("/readyz")
    async def readyz(request: Request) -> Response:
        """Readiness: not shutting down, the store takes writes (its SQLite file is still
        the one opened), and some runtime instance answers. 503 with the failing checks."""
        ctx = context(request)
        reachable = await ctx.gateway.reachable_instances()
        checks: dict[str, Any] = {
            "shutdown": {"ok": not ctx.shutdown.draining},
            "store": await ctx.stored.readiness(),
            "runtimes": {"ok": bool(reachable), "reachable": reachable},
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


def _error_response(path: str, error: ApiError) -> Response:
    """The error in the envelope of the API the request addressed: Anthropic's on the Messages
    routes, OpenAI's everywhere else."""
    if path.startswith(anthropic.PREFIX):
        status, body = anthropic_error(error)
        return json_response(body, status, error.headers())
    return json_response(error.body(), error.status, error.headers())


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return _error_response(request.url.path, exc)

    @app.exception_handler(BodyTimeout)
    async def body_timeout(request: Request, exc: BodyTimeout) -> Response:
        error = ApiError(408, str(exc), code="request_timeout")
        response = _error_response(request.url.path, error)
        response.headers["connection"] = "close"  # the rest of the body is not waited for
        return response

    @app.exception_handler(Forwarded)
    async def forwarded(request: Request, exc: Forwarded) -> Response:
        return exc.response

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first["loc"] if p not in ("body", "query", "path"))
        error = ApiError(422, f"Invalid request: {param}: {first['msg']}", param=param or None)
        return _error_response(request.url.path, error)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        error = ApiError(exc.status_code, str(exc.detail), type=kind)
        return _error_response(request.url.path, error)
