"""The writer's batches on one kept connection (proxy/store/kept_writes.py), on both backends:
batches go through one connection held between them; on PostgreSQL, a connection the server
dropped fails one batch, and the next is written on a fresh one; closing returns it."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from talaria.proxy.store.kept_writes import KeptConnectionWrites
from talaria.proxy.store.repository import SqlStore
from tests.store.test_store_repository import session


@pytest.mark.asyncio
async def test_batches_keep_one_connection_and_replace_a_dropped_one(
    engine: AsyncEngine, store: SqlStore, db_url: str
) -> None:
    writes = KeptConnectionWrites(engine)
    await writes.write_batch([session("k1")])
    await writes.write_batch([session("k2")])
    assert engine.pool.checkedout() == 1  # held between batches
    if db_url.startswith("postgresql"):
        async with engine.connect() as other:  # the server drops every other connection
            await other.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
        with pytest.raises(Exception) as failed:
            await writes.write_batch([session("k3")])
        assert not writes.is_content_error(failed.value)  # retried by the writer, not dropped
        assert engine.pool.checkedout() == 0  # the broken one was closed
    await writes.write_batch([session("k3")])
    await writes.close()
    assert engine.pool.checkedout() == 0
    for key in ("k1", "k2", "k3"):
        assert await store.sessions.get_session(key) is not None
