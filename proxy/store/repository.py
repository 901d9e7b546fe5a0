"""``SqlStore``: the whole session store over one ``async_sessionmaker``.

It writes the batches of the :class:`~talaria.proxy.store.writer.BatchWriter` (see
``batch.py`` for how each record becomes rows) and holds one object per group of tables, each
in its own module, for everything read or written outside those batches:

- ``sessions`` (sessions.py): sessions, calls, routing decisions, reservations and hints;
- ``cluster`` (cluster.py): replicas sharing the database, runtime instances, drains;
- ``tenants`` (tenants.py): tenants and API keys;
- ``usage`` (usage.py): the rate-limited keys' calls and tokens per minute;
- ``dead_letters`` (deadletters.py): records the database refused.

A caller that needs one group takes just that object (``Membership`` takes ``cluster``).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from talaria.proxy.contract.records import Record
from talaria.proxy.store.batch import apply_batch
from talaria.proxy.store.cluster import ClusterTables
from talaria.proxy.store.deadletters import DeadLetterTable
from talaria.proxy.store.health import SqliteFileGuard, is_content_error
from talaria.proxy.store.sessions import SessionTables
from talaria.proxy.store.tenants import TenantTables
from talaria.proxy.store.usage import UsageTable


class SqlStore:
    """The batched writes, a health ping, and the table groups. With a ``guard`` (a SQLite
    file), every write first checks that the file is still the one the proxy opened
    (health.py)."""

    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        guard: SqliteFileGuard | None = None,
    ) -> None:
        self._sessionmaker = sessionmaker
        self._guard = guard
        self.sessions = SessionTables(sessionmaker)
        self.cluster = ClusterTables(sessionmaker)
        self.tenants = TenantTables(sessionmaker)
        self.usage = UsageTable(sessionmaker)
        self.dead_letters = DeadLetterTable(sessionmaker, guard)

    @property
    def sessionmaker(self) -> async_sessionmaker[AsyncSession]:
        """The sessions its table groups read with; a dialect's own tables use it too
        (proxy/dialects/responses/tables.py)."""
        return self._sessionmaker

    async def write_batch(self, records: Sequence[Record]) -> None:
        """Apply ``records`` in order, in one transaction (all or nothing). Safe to retry.
        ``StoreFileGone`` if the SQLite file was deleted or replaced."""
        if not records:
            return
        if self._guard is not None:
            self._guard.check()
        async with self._sessionmaker() as db, db.begin():
            connection = await db.connection()
            await connection.run_sync(apply_batch, records)

    def is_content_error(self, exc: BaseException) -> bool:
        """Whether a write failed for the records' content (health.is_content_error)."""
        return is_content_error(exc)

    async def ping(self) -> None:
        """Raise unless the database answers a query (and its SQLite file is still there)."""
        if self._guard is not None:
            self._guard.check()
        async with self._sessionmaker() as db:
            await db.execute(select(1))
