"""``KeptConnectionWrites``: the writer's batches on PostgreSQL, on one connection kept between
them.

``SqlStore.write_batch`` checks a connection out of the pool for each batch, and the pool pings
it first (``pool_pre_ping``, db.py: a round trip, so that a connection a server restart dropped
is replaced). For the writer, one batch after another, that ping was about 6 % of a replica's
CPU under the cluster benchmark (docs/proxy-overhead.md). Here the connection stays checked out
between batches: each batch is BEGIN, its statements, COMMIT. A batch that fails closes it (the
writer retries, splits or quarantines the batch as before), and the next one checks out a fresh
connection, pinged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from talaria.proxy.contract.records import Record
from talaria.proxy.store.batch import apply_batch
from talaria.proxy.store.health import is_content_error


class KeptConnectionWrites:
    """Writes batches through ``engine`` on a connection kept between them (module
    docstring); one writer at a time (the ``BatchWriter``)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._connection: AsyncConnection | None = None

    async def write_batch(self, records: Sequence[Record]) -> None:
        """Apply ``records`` in order, in one transaction (all or nothing). Safe to retry."""
        if not records:
            return
        connection, self._connection = self._connection, None
        if connection is None:
            connection = await self._engine.connect()
        try:
            async with connection.begin():
                await connection.run_sync(apply_batch, records)
        except BaseException:
            await asyncio.shield(connection.close())
            raise
        self._connection = connection

    def is_content_error(self, exc: BaseException) -> bool:
        """Whether a write failed for the records' content (health.is_content_error)."""
        return is_content_error(exc)

    async def close(self) -> None:
        """Return the connection to the pool (before the engine is disposed)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()
