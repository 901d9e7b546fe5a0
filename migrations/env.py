"""Alembic environment for the session store, async-capable.

The database URL comes from the Config's ``sqlalchemy.url`` main option (set by
``talaria.proxy.store.migrate``); a caller that already holds a sync ``Connection`` may pass it
as ``config.attributes["connection"]`` instead. On SQLite, operations are rendered in batch
mode (table copy-and-move), the only way SQLite can alter most things.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import pool, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from talaria.proxy.dialects.registry import DIALECTS
from talaria.proxy.store.models import Base

assert DIALECTS  # imported for its dialects' own tables, which join Base.metadata

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: set the Alembic Config's sqlalchemy.url")
    return url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


MIGRATION_LOCK = 7_212_200_001
"""PostgreSQL advisory lock key taken for a migration's transaction: replicas that start at
the same moment migrate one after the other (the second then finds the schema at head),
instead of racing to create the same tables."""


def _run_sync(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        # held until the migration's transaction ends; SQLite's writes lock the file anyway
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
    _configure(connection)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit SQL for the URL's dialect instead of running it (``alembic upgrade --sql``)."""
    url = _url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_async_migrations() -> None:
    """Connect with the async driver named by the URL and migrate on that connection."""
    engine = create_async_engine(_url(), poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run_sync)
            await connection.commit()
    finally:
        await engine.dispose()


def run_migrations_online() -> None:
    """Migrate on the given connection, or on a new one in a fresh event loop."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_sync(connection)
    else:
        asyncio.run(run_async_migrations())


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
