"""The proxy's services, each declared with what it needs (proxy/edge/lifecycle.py starts
them in that order and stops them in the reverse one):

| service | its part | needs | stops by |
|---|---|---|---|
| ``store`` | the store, its writer and dead letters (``StoreService``) | | closing it, last |
| ``limits`` | the API keys' rate limits, synced with the store | store | its last flush |
| ``metrics`` | the proxy's metrics | | |
| ``catalog`` | the model catalog | | |
| ``runtimes`` | the runtime clients, started | catalog | closing them |
| ``gateway`` | the call path's gateway, sweeping | store, runtimes, catalog | ``shutdown`` |
| ``dialects`` | each stateful dialect's service, started | store | closing them |
| ``auth`` | the API keys' authenticator | store | |
| ``instances`` | the runtime instances' records, submitted | store, runtimes | |
| ``cluster`` | this replica among its peers (None alone) | store, gateway | leaving |
| ``placement`` | the placement loop (None: no library) | gateway, catalog, cluster | closing it |
| ``shutdown`` | the drain of the gateway and the writer | gateway, store, cluster | draining |
| ``watchdog`` | the event loop's stall watch | | stopping it |
| ``stale`` | with replicas, ending sessions no replica holds | store, cluster | cancelling it |

So on SIGTERM the stale-session sweep and the watchdog stop, the gateway and the writer drain
(``shutdown``), then placement, the replica's membership, the dialects' services and the
runtime clients close, the rate limits flush their last counts (the drained calls' tokens
too), and the store closes last. :func:`context_of` is what the routes reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta

from talaria.core.catalog import Catalog, CatalogError, load_catalog
from talaria.core.clock import Clock, LoopClock
from talaria.core.groups import group_floor
from talaria.core.loop_watchdog import LoopWatchdog
from talaria.core.placement import PlacementConfig
from talaria.proxy.callpath.auth import Authenticator
from talaria.proxy.callpath.context import ProxyContext
from talaria.proxy.callpath.gateway import Gateway
from talaria.proxy.callpath.limiter import RateLimiter
from talaria.proxy.callpath.shutdown import Shutdown
from talaria.proxy.cluster.forward import Cluster
from talaria.proxy.cluster.handoff import AdoptableSession
from talaria.proxy.cluster.membership import Membership
from talaria.proxy.contract.metrics import ProxyMetrics
from talaria.proxy.contract.records import InstanceRecord, SessionRecord
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.dialects.base import Dialect, DialectService, DialectSite
from talaria.proxy.edge.lifecycle import Lifecycle, Parts
from talaria.proxy.placement.library import load_library
from talaria.proxy.placement.loop import LEADER_KEY, PlacementLoop
from talaria.proxy.runtimes.base import RuntimeClient
from talaria.proxy.runtimes.embedded import build_embedded
from talaria.proxy.runtimes.http import HttpRuntime
from talaria.proxy.store.db import default_url, sqlite_path
from talaria.proxy.store.repository import SqlStore
from talaria.proxy.store.service import StoreService

log = logging.getLogger("talaria.proxy")


def declare(
    life: Lifecycle,
    cfg: ProxySettings,
    *,
    runtimes: Sequence[RuntimeClient] | None,
    clock: Clock,
    dialects: Sequence[Dialect],
    wall_clock: Callable[[], float] = time.time,
) -> None:
    """Declare the proxy's services (module docstring) on ``life``: ``runtimes`` given (a test's)
    or built from the settings (HTTP runtimes, else the embedded simulated nodes);
    ``wall_clock``: seconds since the epoch, the rate limits' minutes."""
    metrics = ProxyMetrics()

    async def store(_: Parts) -> StoreService:
        return await StoreService.open(cfg)

    async def limits(parts: Parts) -> RateLimiter:
        usage = parts.get("store", StoreService).store.usage
        made = RateLimiter(usage, sync_s=cfg.rate_sync_s, clock=wall_clock)
        await made.start()  # the minute's totals, read once before serving
        return made

    async def close_limits(part: object) -> None:
        assert isinstance(part, RateLimiter)
        await part.close()

    async def catalog(_: Parts) -> Catalog:
        try:
            return load_catalog(cfg.catalog_path)
        except CatalogError as exc:
            raise RuntimeError(f"cannot load the model catalog: {exc}") from exc

    async def clients(parts: Parts) -> list[RuntimeClient]:
        started: list[RuntimeClient] = []
        try:
            for client in _runtime_clients(cfg, runtimes, parts.get("catalog", Catalog), clock):
                started.append(client)
                await client.start()
        except BaseException:
            await _close_all(started)
            raise
        return started

    async def gateway(parts: Parts) -> Gateway:
        catalog_ = parts.get("catalog", Catalog)
        made = Gateway(
            parts.get("runtimes", list),
            parts.get("store", StoreService).writer,
            metrics,
            clock,
            router=cfg.router,
            routing_seed=cfg.routing_seed,
            catalog_windows={m: s.context_window_tokens for m, s in catalog_.models.items()},
            max_inflight_per_tenant=cfg.max_inflight_per_tenant,
            max_sessions_per_tenant=cfg.max_sessions_per_tenant,
            max_threads_per_session=cfg.max_threads_per_session,
            session_idle_timeout_s=cfg.session_idle_timeout_s,
            durable=cfg.durability == "commit",
            commit_timeout_s=cfg.commit_timeout_s,
            time_scale=clock.scale if isinstance(clock, LoopClock) else 1.0,
        )
        made.start()
        return made

    async def dialect_services(parts: Parts) -> dict[str, DialectService]:
        stored = parts.get("store", StoreService)
        site = DialectSite(cfg, stored.store, stored.writer)
        started: dict[str, DialectService] = {}
        try:
            for dialect in dialects:
                if dialect.service is not None:
                    service = dialect.service(site)
                    await service.start()  # e.g. the storage quota's totals, before serving
                    started[dialect.name] = service
        except BaseException:
            await _close_services(started)
            raise
        return started

    async def auth(parts: Parts) -> Authenticator:
        made = Authenticator(
            cfg.api_keys,
            parts.get("store", StoreService).store.tenants,
            allow_open=cfg.allow_open,
            metrics_token=cfg.metrics_token,
        )
        await made.start()  # reads the key mode and warns when it is open
        return made

    async def instances(parts: Parts) -> None:
        now, writer = datetime.now(UTC), parts.get("store", StoreService).writer
        for client in parts.get("runtimes", list):
            record = InstanceRecord(
                client.name, client.kind, client.address, list(client.models), now
            )
            writer.submit(record)

    async def cluster(parts: Parts) -> Cluster | None:
        stored, gateway_ = parts.get("store", StoreService), parts.get("gateway", Gateway)
        return await _join_replicas(cfg, stored.store, gateway_)

    async def placement(parts: Parts) -> PlacementLoop | None:
        return _start_placement(
            cfg,
            parts.get("gateway", Gateway),
            parts.get("catalog", Catalog),
            clock,
            parts.optional("cluster", Cluster),
        )

    async def shutdown(parts: Parts) -> Shutdown:
        stored, joined = parts.get("store", StoreService), parts.optional("cluster", Cluster)
        return Shutdown(
            parts.get("gateway", Gateway),
            stored.writer,
            stored.dead_letters,
            cfg.drain_timeout_s,
            leave=joined.membership.stop if joined else None,
            relays=joined.abort_relays if joined else None,
        )

    async def watchdog(_: Parts) -> LoopWatchdog:
        made = LoopWatchdog(stall_s=cfg.loop_stall_s)
        made.start()
        return made

    async def stale(parts: Parts) -> asyncio.Task[None] | None:
        if parts.optional("cluster", Cluster) is None:
            return None
        sweep = _end_stale_sessions(parts.get("store", StoreService).store, cfg)
        return asyncio.get_running_loop().create_task(sweep)

    async def close_store(part: object) -> None:
        assert isinstance(part, StoreService)
        await part.close()

    async def close_clients(part: object) -> None:
        assert isinstance(part, list)
        await _close_all(part)

    async def close_dialects(part: object) -> None:
        assert isinstance(part, dict)
        await _close_services(part)

    async def leave(part: object) -> None:
        if isinstance(part, Cluster):
            await part.close()

    async def close_placement(part: object) -> None:
        if isinstance(part, PlacementLoop):
            await part.close()

    async def drain(part: object) -> None:
        assert isinstance(part, Shutdown)
        await part.finish()

    async def stop_watchdog(part: object) -> None:
        assert isinstance(part, LoopWatchdog)
        part.stop()

    async def cancel(part: object) -> None:
        if isinstance(part, asyncio.Task):
            part.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await part

    life.add("store", store, close_store)
    life.add("limits", limits, close_limits, needs=("store",))  # stops after the drain
    life.add("catalog", catalog)
    life.add("runtimes", clients, close_clients, needs=("catalog",))
    life.add("gateway", gateway, needs=("store", "runtimes", "catalog"))
    life.add("dialects", dialect_services, close_dialects, needs=("store",))
    life.add("auth", auth, needs=("store",))
    life.add("instances", instances, needs=("store", "runtimes"))
    life.add("cluster", cluster, leave, needs=("store", "gateway"))
    life.add("placement", placement, close_placement, needs=("gateway", "catalog", "cluster"))
    life.add("shutdown", shutdown, drain, needs=("gateway", "store", "cluster"))
    life.add("watchdog", watchdog, stop_watchdog)
    life.add("stale", stale, cancel, needs=("store", "cluster"))
    life.add("metrics", _constant(metrics))


def _constant(part: object) -> Callable[[Parts], Awaitable[object]]:
    async def start(_: Parts) -> object:
        return part

    return start


def context_of(cfg: ProxySettings, parts: Parts) -> ProxyContext:
    """What every route reaches (proxy/callpath/context.py), from the started services."""
    stored = parts.get("store", StoreService)
    return ProxyContext(
        settings=cfg,
        gateway=parts.get("gateway", Gateway),
        store=stored.store,
        writer=stored.writer,
        metrics=parts.get("metrics", ProxyMetrics),
        auth=parts.get("auth", Authenticator),
        stored=stored,
        shutdown=parts.get("shutdown", Shutdown),
        watchdog=parts.get("watchdog", LoopWatchdog),
        cluster=parts.optional("cluster", Cluster),
        placement=parts.optional("placement", PlacementLoop),
        limits=parts.get("limits", RateLimiter),
    )


def _runtime_clients(
    cfg: ProxySettings, given: Sequence[RuntimeClient] | None, catalog: Catalog, clock: Clock
) -> list[RuntimeClient]:
    """``given``, else a client per ``TALARIA_RUNTIMES`` URL, else the embedded nodes."""
    if given is not None:
        return list(given)
    if cfg.runtimes:
        token = cfg.runtime_token.get_secret_value() if cfg.runtime_token else None
        return [
            HttpRuntime(
                url,
                status_ttl_s=cfg.status_ttl_s,
                status_stale_s=cfg.status_stale_s,
                status_timeout_s=cfg.status_timeout_s,
                token=token,
            )
            for url in cfg.runtimes
        ]
    return list(build_embedded(cfg, catalog, clock))


async def _close_all(clients: Sequence[RuntimeClient]) -> None:
    for client in clients:
        await client.close()


async def _close_services(services: dict[str, DialectService]) -> None:
    for service in reversed(list(services.values())):
        await service.close()


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

    async def adopt(
        tenant_id: str, session_id: str, claim: SessionRecord | None = None, /
    ) -> AdoptableSession | None:
        found = await store.sessions.open_root_session(tenant_id, session_id, claim)
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
            group_floor=lambda model, server: group_floor(catalog, model, server),
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
