"""The services that span the fleet, built for proxy/edge/services.py: this replica joining
its peers (membership, the hand-off of sessions, the drains they share), the placement loop
over the runtimes, and the sweep that ends the sessions no live replica holds."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from talaria.core.catalog import Catalog
from talaria.core.clock import Clock
from talaria.core.groups import group_floor
from talaria.proxy.callpath.gateway import Gateway
from talaria.proxy.cluster.forward import Cluster
from talaria.proxy.cluster.handoff import AdoptableSession
from talaria.proxy.cluster.membership import Membership
from talaria.proxy.contract.records import SessionRecord
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.placement.library import load_library
from talaria.proxy.placement.loop import LEADER_KEY, PlacementLoop
from talaria.proxy.placement.settings import PlacementSettings
from talaria.proxy.runtimes.pool import RuntimePool
from talaria.proxy.store.db import default_url, sqlite_path
from talaria.proxy.store.repository import SqlStore

log = logging.getLogger("talaria.proxy")


async def join_replicas(
    cfg: ProxySettings, store: SqlStore, pool: RuntimePool, gateway: Gateway
) -> Cluster | None:
    """With ``replica_url``: join the replicas sharing the database (PostgreSQL only); the
    instances drained (a row the replicas share) drained in ``pool``, the gateway serving as
    one of the replicas."""
    if cfg.replica_url is None:
        pool.set_drained(await store.cluster.drained())  # a drain outlives a restart
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
        on_drained=pool.set_drained,
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


def start_placement(
    cfg: PlacementSettings,
    pool: RuntimePool,
    catalog: Catalog,
    clock: Clock,
    cluster: Cluster | None,
) -> PlacementLoop | None:
    """With a model library: the placement controller over the runtimes; with replicas, the
    owner of its key looks (proxy/placement/loop.py)."""
    if cfg.placement_library is None:
        return None
    membership = cluster.membership if cluster is not None else None
    try:
        loop = PlacementLoop(
            pool,
            load_library(cfg.placement_library),
            {name: spec.weight_bytes for name, spec in catalog.models.items()},
            cfg.config(),
            clock,
            leads=(lambda: membership.owner_of(LEADER_KEY) is None) if membership else lambda: True,
            cold_start_timeout_s=cfg.placement_cold_start_timeout_s,
            keep_alive_floor_s=cfg.placement_keep_alive_s,
            group_floor=lambda model, server: group_floor(catalog, model, server),
            placement_s=lambda weight, server: placement_s(catalog, weight, server),
        )
    except ValueError as exc:  # a library that does not load, runtimes that cannot place
        raise RuntimeError(f"placement: {exc}") from exc
    loop.start()
    return loop


def placement_s(catalog: Catalog, weight_bytes: float, server: str) -> float | None:
    """Seconds to place ``weight_bytes`` of weights from storage on a ``server`` runtime
    (core/server_spec.py ``placement_s``); None for a server the catalog does not know or one
    without a storage rate."""
    spec = catalog.servers.get(server)
    if spec is None or spec.storage_read_bytes_per_s <= 0:
        return None
    return spec.placement_s(weight_bytes, from_peer=False)


STALE_SWEEP_S = 60.0
"""How often a replica ends the sessions no live replica holds (wall seconds)."""


async def end_stale_sessions(store: SqlStore, cfg: ProxySettings) -> None:
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
