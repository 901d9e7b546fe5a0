"""``ClusterTables``: the proxy replicas sharing the database (``proxy_replicas``), the runtime
instances the gateway has seen (``runtime_instances``, written by the batched writer) and those
being drained (``instance_drains``). proxy/cluster/membership.py reads and writes them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import Table, delete, insert, select, update

from talaria.proxy.contract.records import InstanceRecord
from talaria.proxy.store.db import TableGroup
from talaria.proxy.store.mapping import from_row
from talaria.proxy.store.models import DrainRow, InstanceRow, ReplicaRow, as_utc


@dataclass(frozen=True)
class ClusterView:
    """What a heartbeat round reads: the live replicas ``(name, url)`` by name, and the
    drained runtime instances."""

    live: list[tuple[str, str]]
    drained: set[str]


class ClusterTables(TableGroup):
    """Replica heartbeats, runtime instances and drains."""

    async def heartbeat(
        self, name: str, url: str, started_at: datetime, at: datetime, seen_since: datetime
    ) -> ClusterView:
        """One heartbeat round in one transaction on one connection: record that replica
        ``name`` (reached at ``url``) is alive at ``at``, then read the replicas heard from
        since ``seen_since`` and the drained instances. Core statements, no ORM merge: a
        replica beats every second, and three sessions a beat (three pool checkouts, each
        pinged, and a merge's SELECT) were most of an idle replica's CPU."""
        replica = cast(Table, ReplicaRow.__table__)
        row = {"url": url, "started_at": as_utc(started_at), "last_seen_at": as_utc(at)}
        async with self._sessionmaker() as db, db.begin():
            updated = await db.execute(update(replica).where(replica.c.name == name).values(row))
            if updated.rowcount == 0:  # type: ignore[attr-defined]
                await db.execute(insert(replica).values(name=name, **row))
            live = await db.execute(
                select(ReplicaRow.name, ReplicaRow.url)
                .where(ReplicaRow.last_seen_at >= as_utc(seen_since))
                .order_by(ReplicaRow.name)
            )
            drained = set(await db.scalars(select(DrainRow.name)))
            return ClusterView([(n, u) for n, u in live.all()], drained)

    async def remove_replica(self, name: str) -> None:
        """Delete replica ``name``'s row (it leaves: its peers stop forwarding to it)."""
        async with self._sessionmaker() as db, db.begin():
            await db.execute(delete(ReplicaRow).where(ReplicaRow.name == name))

    async def set_drain(self, name: str, draining: bool, at: datetime) -> None:
        """Mark runtime instance ``name`` drained (or not)."""
        async with self._sessionmaker() as db, db.begin():
            if draining:
                await db.merge(DrainRow(name=name, since=as_utc(at)))
            else:
                await db.execute(delete(DrainRow).where(DrainRow.name == name))

    async def drained(self) -> set[str]:
        """The runtime instances being drained."""
        async with self._sessionmaker() as db:
            return set(await db.scalars(select(DrainRow.name)))

    async def list_instances(self) -> list[InstanceRecord]:
        """Every runtime instance the gateway has seen, by name."""
        async with self._sessionmaker() as db:
            rows = await db.scalars(select(InstanceRow).order_by(InstanceRow.name))
            return [from_row(InstanceRecord, r) for r in rows]
