"""The proxy's services, each declared with what it needs (proxy/edge/lifecycle.py starts
them in that order and stops them in the reverse one):

| service | its part | needs | stops by |
|---|---|---|---|
| ``store`` | the store, its writer and dead letters (``StoreService``) | | closing it, last |
| ``limits`` | the API keys' rate limits, synced with the store | store | its last flush |
| ``metrics`` | the proxy's metrics | | |
| ``catalog`` | the model catalog | | |
| ``runtimes`` | the runtime clients, started | catalog | closing them |
| ``pool`` | the runtimes by name, their models, statuses and drains | runtimes, catalog | |
| ``recorder`` | the records and metrics of calls and sessions | store | |
| ``keeper`` | the sessions between calls: route preferences, hints, ends | recorder, pool | |
| ``gateway`` | the call path's gateway, sweeping | pool, keeper, recorder | ``shutdown`` |
| ``dialects`` | each stateful dialect's service, started | store | closing them |
| ``auth`` | the API keys' authenticator | store | |
| ``instances`` | the runtime instances' records, submitted | store, runtimes | |
| ``cluster`` | this replica among its peers (None alone) | store, pool, gateway | leaving |
| ``placement`` | the placement loop (None: no library) | pool, catalog, cluster | closing it |
| ``shutdown`` | the drain of the gateway and the writer | gateway, store, cluster | draining |
| ``watchdog`` | the event loop's stall watch | | stopping it |
| ``stale`` | with replicas, ending sessions no replica holds | store, cluster | cancelling it |

So on SIGTERM the stale-session sweep and the watchdog stop, the gateway and the writer drain
(``shutdown``), then placement, the replica's membership, the dialects' services and the
runtime clients close, the rate limits flush their last counts (the drained calls' tokens
too), and the store closes last. :func:`context_of` is what the routes reach. Each part is
given to the parts that use it (the pool to placement and the replica's drains, the keeper to
the session routes), never reached through another part. Joining the replicas, placement and
the stale sessions' sweep are built in proxy/edge/fleet.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

from talaria.core.catalog import Catalog, load_catalog
from talaria.core.catalog_error import CatalogError
from talaria.core.clock import Clock, LoopClock, TimeScale
from talaria.core.loop_watchdog import LoopWatchdog
from talaria.proxy.callpath.auth import Authenticator
from talaria.proxy.callpath.context import ProxyContext
from talaria.proxy.callpath.gateway import Gateway
from talaria.proxy.callpath.keeper import SessionKeeper, session_keeper
from talaria.proxy.callpath.limiter import RateLimiter
from talaria.proxy.callpath.recorder import Recorder
from talaria.proxy.callpath.shutdown import Shutdown
from talaria.proxy.cluster.forward import Cluster
from talaria.proxy.contract.metrics import ProxyMetrics
from talaria.proxy.contract.records import InstanceRecord
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.dialects.base import Dialect, DialectService, DialectSite
from talaria.proxy.edge.fleet import end_stale_sessions, join_replicas, start_placement
from talaria.proxy.edge.lifecycle import Lifecycle, Parts
from talaria.proxy.placement.loop import PlacementLoop
from talaria.proxy.placement.settings import PlacementSettings
from talaria.proxy.runtimes.base import RuntimeClient
from talaria.proxy.runtimes.embedded import build_embedded
from talaria.proxy.runtimes.http import HttpRuntime
from talaria.proxy.runtimes.pool import RuntimePool
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
    scale = TimeScale(clock.scale if isinstance(clock, LoopClock) else 1.0)

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

    async def pool(parts: Parts) -> RuntimePool:
        models = parts.get("catalog", Catalog).models
        windows = {name: spec.context_window_tokens for name, spec in models.items()}
        return RuntimePool(parts.get("runtimes", list), scale, windows)

    async def recorder(parts: Parts) -> Recorder:
        writer = parts.get("store", StoreService).writer
        return Recorder(
            writer,
            metrics,
            scale,
            router=cfg.router,
            durable=cfg.durability == "commit",
            commit_timeout_s=cfg.commit_timeout_s,
        )

    async def keeper(parts: Parts) -> SessionKeeper:
        return session_keeper(
            parts.get("recorder", Recorder),
            parts.get("pool", RuntimePool),
            clock,
            scale,
            idle_timeout_s=cfg.session_idle_timeout_s,
            max_sessions_per_tenant=cfg.max_sessions_per_tenant,
            max_threads_per_session=cfg.max_threads_per_session,
        )

    async def gateway(parts: Parts) -> Gateway:
        made = Gateway(
            parts.get("pool", RuntimePool),
            parts.get("keeper", SessionKeeper),
            parts.get("recorder", Recorder),
            clock,
            scale,
            router=cfg.router,
            routing_seed=cfg.routing_seed,
            max_inflight_per_tenant=cfg.max_inflight_per_tenant,
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
        stored, pool_ = parts.get("store", StoreService), parts.get("pool", RuntimePool)
        return await join_replicas(cfg, stored.store, pool_, parts.get("gateway", Gateway))

    async def placement(parts: Parts) -> PlacementLoop | None:
        return start_placement(
            PlacementSettings.of(cfg),
            parts.get("pool", RuntimePool),
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
        sweep = end_stale_sessions(parts.get("store", StoreService).store, cfg)
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
    life.add("pool", pool, needs=("runtimes", "catalog"))
    life.add("recorder", recorder, needs=("store",))
    life.add("keeper", keeper, needs=("recorder", "pool"))
    life.add("gateway", gateway, needs=("pool", "keeper", "recorder"))
    life.add("dialects", dialect_services, close_dialects, needs=("store",))
    life.add("auth", auth, needs=("store",))
    life.add("instances", instances, needs=("store", "runtimes"))
    life.add("cluster", cluster, leave, needs=("store", "pool", "gateway"))
    life.add("placement", placement, close_placement, needs=("pool", "catalog", "cluster"))
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
        pool=parts.get("pool", RuntimePool),
        keeper=parts.get("keeper", SessionKeeper),
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
