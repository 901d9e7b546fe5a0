"""The proxy application: ``create_app(settings)``; the lifespan owns the database engine, the
batched writer, the runtime clients and the gateway."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from talaria.core.body_deadline import BodyDeadline
from talaria.core.catalog import Catalog, CatalogError, load_catalog
from talaria.core.clock import Clock, LoopClock
from talaria.core.loop_watchdog import LoopWatchdog
from talaria.core.placement import PlacementConfig
from talaria.proxy.api import admin, sessions
from talaria.proxy.api import models as models_api
from talaria.proxy.callpath.auth import Authenticator
from talaria.proxy.callpath.context import ProxyContext, context, json_response
from talaria.proxy.callpath.gateway import Gateway
from talaria.proxy.callpath.shutdown import Shutdown
from talaria.proxy.cluster.forward import Cluster
from talaria.proxy.cluster.handoff import AdoptableSession
from talaria.proxy.cluster.membership import Membership
from talaria.proxy.console import routes as console
from talaria.proxy.console.auth import ConsoleAuth
from talaria.proxy.contract.metrics import ProxyMetrics
from talaria.proxy.contract.records import InstanceRecord
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.dialects.base import Dialect
from talaria.proxy.dialects.registry import DIALECTS
from talaria.proxy.dialects.responses.store import ResponseStore
from talaria.proxy.edge.http import (
    RequestIdMiddleware,
    declare_request_models,
    install_error_handlers,
)
from talaria.proxy.edge.lanes import ASGIApp, ProxyApp
from talaria.proxy.placement.library import load_library
from talaria.proxy.placement.loop import LEADER_KEY, PlacementLoop
from talaria.proxy.runtimes.base import RuntimeClient
from talaria.proxy.runtimes.embedded import build_embedded
from talaria.proxy.runtimes.http import HttpRuntime
from talaria.proxy.store.db import default_url, sqlite_path
from talaria.proxy.store.repository import SqlStore
from talaria.proxy.store.service import StoreService

log = logging.getLogger("talaria.proxy")


def freeze_startup_objects() -> None:
    """Move every object alive after start-up (modules, the app, the catalog) out of the
    cyclic collector's reach (``gc.freeze``). Otherwise each full collection walks them all:
    on the 2-core box that was a 45 ms stall of the event loop every few seconds under load,
    most of the p99 latency (docs/proxy-overhead.md)."""
    gc.collect()
    gc.freeze()


async def _join_replicas(cfg: ProxySettings, store: SqlStore, gateway: Gateway) -> Cluster | None:
    """With ``replica_url``: join the replicas sharing the database (PostgreSQL only)."""
    if cfg.replica_url is None:
        gateway.pool.set_drained(await store.cluster.drained())  # a drain outlives a restart
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
        on_drained=gateway.pool.set_drained,
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

    gateway.use_replicas(
        lambda key: membership.owner_of(key) is None, adopt, lambda: membership.generation
    )
    assert cfg.cluster_secret is not None  # ProxySettings requires it with replica_url
    cluster = Cluster(membership, cfg.cluster_secret, cfg.replica_read_timeout_s)
    cluster.start()
    return cluster


def _start_placement(
    cfg: ProxySettings, gateway: Gateway, catalog: Catalog, clock: Clock, cluster: Cluster | None
) -> PlacementLoop | None:
    """With a model library: the placement controller over the runtimes; with replicas, the
    owner of its key looks (proxy/placement/loop.py)."""
    if cfg.placement_library is None:
        return None
    config = PlacementConfig(
        interval_s=cfg.placement_interval_s,
        window_s=cfg.placement_window_s,
        min_hold_s=cfg.placement_min_hold_s,
        drain_s=cfg.placement_drain_s,
    )
    membership = cluster.membership if cluster is not None else None
    try:
        loop = PlacementLoop(
            gateway.pool,
            load_library(cfg.placement_library),
            {name: spec.weight_bytes for name, spec in catalog.models.items()},
            config,
            clock,
            leads=(lambda: membership.owner_of(LEADER_KEY) is None) if membership else lambda: True,
            cold_start_timeout_s=cfg.placement_cold_start_timeout_s,
        )
    except ValueError as exc:  # a library that does not load, runtimes that cannot place
        raise RuntimeError(f"placement: {exc}") from exc
    loop.start()
    return loop


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
    dialects: Sequence[Dialect] = DIALECTS,
    call_lanes: bool = True,
) -> FastAPI:
    """The proxy. Without ``runtimes`` it builds the embedded simulated node(s) of
    ``settings``; without ``clock`` it uses the loop's time × ``settings.time_scale``;
    ``dialects``: the APIs it speaks (proxy/dialects/registry.py); ``call_lanes``: their
    call routes served around FastAPI's routing (proxy/edge/lanes.py; False: through it, as the
    lanes' equivalence test compares)."""
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
            token = cfg.runtime_token.get_secret_value() if cfg.runtime_token else None
            clients = [
                HttpRuntime(
                    url,
                    status_ttl_s=cfg.status_ttl_s,
                    status_stale_s=cfg.status_stale_s,
                    status_timeout_s=cfg.status_timeout_s,
                    token=token,
                )
                for url in cfg.runtimes
            ]
        else:
            clients = list(build_embedded(cfg, catalog, the_clock))
        for client in clients:
            await client.start()
        windows = {m: spec.context_window_tokens for m, spec in catalog.models.items()}
        metrics = ProxyMetrics()
        gateway = Gateway(
            clients,
            writer,
            metrics,
            the_clock,
            router=cfg.router,
            routing_seed=cfg.routing_seed,
            catalog_windows=windows,
            max_inflight_per_tenant=cfg.max_inflight_per_tenant,
            max_sessions_per_tenant=cfg.max_sessions_per_tenant,
            max_threads_per_session=cfg.max_threads_per_session,
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
        placement = _start_placement(cfg, gateway, catalog, the_clock, cluster)
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
            placement,
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
            if placement is not None:
                await placement.close()
            await responses.close()
            await shutdown.finish()
            watchdog.stop()
            if cluster is not None:
                await cluster.close()
            for client in clients:
                await client.close()
            await stored.close()

    app = ProxyApp(
        title="Talaria proxy",
        description="OpenAI-compatible, session-aware gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )

    def edge(inner: ASGIApp) -> ASGIApp:
        """What every request meets around its route (outermost first)."""
        return BodyDeadline(RequestIdMiddleware(inner), timeout_s=cfg.body_timeout_s)

    app.add_middleware(RequestIdMiddleware)  # FastAPI's stack: the same edge, in this order
    app.add_middleware(BodyDeadline, timeout_s=cfg.body_timeout_s)
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
            "instances": [r.name for r in ctx.gateway.pool.runtimes],
        }
        return json_response(body, 200 if loop["ok"] else 503)

    @app.get("/readyz")
    async def readyz(request: Request) -> Response:
        """Readiness: not shutting down, the store takes writes (its SQLite file is still
        the one opened), and some runtime instance answers. 503 with the failing checks."""
        ctx = context(request)
        reachable = await ctx.gateway.pool.reachable()
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
