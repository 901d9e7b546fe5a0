"""Fixtures for the session store tests, run on SQLite and on PostgreSQL.

``db_url`` is parametrized over both backends. SQLite: a new file per test. PostgreSQL: the
server named by ``TALARIA_TEST_PG_URL`` (``scripts/test.sh`` starts one), with the ``public``
schema dropped and recreated before each test: a few milliseconds, and every test starts from
an empty database without creating databases. Without the variable the PostgreSQL cases are
skipped, except under CI (``CI`` set), where they fail so that CI cannot skip them silently.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from talaria.proxy.store.db import make_engine, make_sessionmaker
from talaria.proxy.store.migrate import upgrade_async
from talaria.proxy.store.repository import SqlStore
from tests.support import pg_url, reset_postgres


@pytest_asyncio.fixture(params=["sqlite", "postgresql"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database on each backend."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"
    url = pg_url()
    await reset_postgres(url)
    return url


@pytest_asyncio.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on a database migrated to head."""
    await upgrade_async(db_url)
    eng = make_engine(db_url)
    try:
        yield eng
    finally:
        await eng.dispose()


@pytest_asyncio.fixture
async def store(engine: AsyncEngine) -> SqlStore:
    """A ``SqlStore`` on the migrated database."""
    return SqlStore(make_sessionmaker(engine))
