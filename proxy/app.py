"""The proxy application: ``create_app(settings)``; the lifespan owns the database engine, the
batched writer, the runtime clients and the gateway."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from talaria.core.catalog import CatalogError, load_catalog
from talaria.core.clock import Clock, LoopClock
from talaria.proxy.api import admin, anthropic, openai
from talaria.proxy.api import responses as responses_api
from talaria.proxy.api.context import ProxyContext, context, json_response
from talaria.proxy.auth import Authenticator
from talaria.proxy.dialects.anthropic import error_body as anthropic_error
from talaria.proxy.embedded import build_embedded
from talaria.proxy.errors import ApiError
from talaria.proxy.gateway import Gateway
from talaria.proxy.http_runtime import HttpRuntime
from talaria.proxy.metrics import ProxyMetrics
from talaria.proxy.records import InstanceRecord
from talaria.proxy.responses_store import ResponseStore
from talaria.proxy.runtime_client import RuntimeClient
from talaria.proxy.settings import ProxySettings
from talaria.proxy.store.db import default_url, make_engine, make_sessionmaker
from talaria.proxy.store.migrate import upgrade_async
from talaria.proxy.store.repository import SqlStore
from talaria.proxy.store.writer import BatchWriter

log = logging.getLogger("talaria.proxy")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class RequestIdMiddleware:
    """Gives every request an id (``request.state.request_id``) and every response the
    ``x-request-id`` header — errors and streams included."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        await self.app(scope, receive, send_with_id)


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
        url = cfg.database_url or default_url()
        if cfg.auto_migrate:
            await upgrade_async(url)
        engine = make_engine(url)
        store = SqlStore(make_sessionmaker(engine))
        writer = BatchWriter(store, flush_interval_s=cfg.writer_flush_interval_s)
        await writer.start()
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
            session_idle_timeout_s=cfg.session_idle_timeout_s,
        )
        gateway.start()
        responses = ResponseStore(
            writer, store, enabled=cfg.store_responses, ttl_s=cfg.responses_ttl_s
        )
        purger = asyncio.get_running_loop().create_task(_purge_responses(responses))
        auth = Authenticator(cfg.api_keys, store, await store.count_api_keys(active_only=True))
        if auth.open:
            log.warning("no API keys configured: serving local callers with any key")
        now = datetime.now(UTC)
        for client in clients:
            record = InstanceRecord(
                client.name, client.kind, client.address, list(client.models), now
            )
            writer.submit(record)
        app.state.talaria = ProxyContext(cfg, gateway, store, writer, metrics, auth, responses)
        try:
            yield
        finally:
            purger.cancel()
            await asyncio.gather(purger, return_exceptions=True)
            await gateway.close()
            for client in clients:
                await client.close()
            await writer.close()
            await engine.dispose()

    app = FastAPI(
        title="Talaria proxy",
        description="OpenAI-compatible, session-aware gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.add_middleware(RequestIdMiddleware)
    app.include_router(openai.router)
    app.include_router(anthropic.router)
    app.include_router(responses_api.router)
    app.include_router(admin.router)
    _install_error_handlers(app)

    @app.get("/healthz")
    async def healthz(request: Request) -> Response:
        ctx = context(request)
        return json_response({"ok": True, "instances": [r.name for r in ctx.gateway.runtimes]})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        ctx = context(request)
        ctx.metrics.writer_pending.set(ctx.writer.pending)
        return Response(ctx.metrics.render(), media_type="text/plain; version=0.0.4")

    return app


def _error_response(request: Request, error: ApiError) -> Response:
    """The error in the envelope of the API the request addressed: Anthropic's on the Messages
    routes, OpenAI's everywhere else."""
    if request.url.path.startswith(anthropic.PREFIX):
        status, body = anthropic_error(error)
        return json_response(body, status, error.headers())
    return json_response(error.body(), error.status, error.headers())


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return _error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first["loc"] if p not in ("body", "query", "path"))
        error = ApiError(422, f"Invalid request: {param}: {first['msg']}", param=param or None)
        return _error_response(request, error)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        error = ApiError(exc.status_code, str(exc.detail), type=kind)
        return _error_response(request, error)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error", exc_info=exc)
        error = ApiError(500, "Internal error; see the proxy's log.", type="server_error")
        return _error_response(request, error)
