"""Which proxy replicas share the database now, and which runtime instances are drained.

Every ``heartbeat_s`` a replica writes its row in ``proxy_replicas`` (name, URL, now) and reads
the rows heard from within ``ttl_s``: those are the live replicas, itself always included.
In the same round it reads ``instance_drains`` and hands the set to the gateway. A replica
that a forward could not reach is left out of the owner choice for ``ttl_s`` (or until its
row shows it again after that); on stop a replica deletes its row, so that its peers stop
forwarding to it at their next round.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from talaria.proxy.cluster.owner import owner
from talaria.proxy.store.cluster import ClusterTables

log = logging.getLogger("talaria.proxy.cluster")


class Membership:
    """This replica's heartbeat and its view of the live peers and drained instances (module
    docstring); ``heartbeat_s`` and ``ttl_s`` are wall seconds."""

    def __init__(
        self,
        store: ClusterTables,
        name: str,
        url: str,
        *,
        heartbeat_s: float,
        ttl_s: float,
        on_drained: Callable[[set[str]], None],
    ) -> None:
        self.name, self.url = name, url.rstrip("/")
        self._store = store
        self._heartbeat_s, self._ttl_s = heartbeat_s, ttl_s
        self._on_drained = on_drained
        self._started_at = datetime.now(UTC)
        self._peers: dict[str, str] = {}
        self.generation = 0
        """Counts the changes of the live set (a peer joined or left): an ingress that hashes
        sessions over the replicas moves some of them at each."""
        self._down_until: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def peers(self) -> dict[str, str]:
        """Live replicas other than this one: name → URL."""
        return dict(self._peers)

    async def start(self) -> None:
        """One round before serving (so the first calls see the peers), then one per beat."""
        await self.beat()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            try:
                await self.beat()
            except Exception as exc:  # the store may be down: keep the last view
                log.warning("replica heartbeat failed: %r", exc)

    async def beat(self) -> None:
        """One round: write this replica's row, read the live peers (heard from within
        ``ttl_s``) and hand the drained instances to ``on_drained``."""
        now = datetime.now(UTC)
        seen_since = now - timedelta(seconds=self._ttl_s)
        view = await self._store.heartbeat(self.name, self.url, self._started_at, now, seen_since)
        peers = {name: url for name, url in view.live if name != self.name}
        if peers.keys() != self._peers.keys():
            self.generation += 1
        self._peers = peers
        self._on_drained(view.drained)

    def mark_down(self, name: str) -> None:
        """A forward to ``name`` could not connect, or its /healthz did not answer (relays.py):
        leave it out for ``ttl_s``."""
        self._down_until[name] = time.monotonic() + self._ttl_s

    def reachable(self) -> dict[str, str]:
        """Live peers not marked down: name → URL."""
        now = time.monotonic()
        return {n: u for n, u in self._peers.items() if self._down_until.get(n, 0) <= now}

    def owner_of(self, key: str) -> tuple[str, str] | None:
        """(name, URL) of the replica that owns ``key``; None when it is this one."""
        candidates = self.reachable()
        chosen = owner(key, [self.name, *candidates])
        return None if chosen == self.name else (chosen, candidates[chosen])

    async def stop(self) -> None:
        """Stop the heartbeat and delete this replica's row (a failure is only logged)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            await self._store.remove_replica(self.name)
        except Exception as exc:
            log.warning("could not remove this replica's row: %r", exc)
