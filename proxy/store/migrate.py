"""Running the store's Alembic migrations from code (``talaria db ...`` wraps these).

The script directory is the installed ``talaria.migrations`` package, never a path relative to
the working directory. The sync functions run Alembic, whose ``env.py`` starts its own event
loop (``asyncio.run``), so they must not be called from inside a running loop: there, use
:func:`upgrade_async`, which runs the same command in a worker thread.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import as_file, files
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from talaria.proxy.store.db import ensure_private_sqlite_file, sqlite_path


def script_location() -> Path:
    """The directory holding ``env.py`` and ``versions/``, from the installed package."""
    with as_file(files("talaria.migrations")) as path:
        return Path(path)


def alembic_config(url: str) -> Config:
    """An Alembic ``Config`` for ``url`` (no ini file needed)."""
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    # ConfigParser interpolates "%": a password like "p%40ss" must reach env.py unchanged.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision``. Processes migrating the same
    database at once take turns: on PostgreSQL through an advisory lock (migrations/env.py),
    on SQLite through an exclusive ``flock`` on the file's ``.migrate-lock`` sidecar."""
    ensure_private_sqlite_file(url)  # a new SQLite file: mode 0600
    with _sqlite_migration_lock(url):
        command.upgrade(alembic_config(url), revision)


@contextmanager
def _sqlite_migration_lock(url: str) -> Iterator[None]:
    """Hold an exclusive lock on ``<file>.migrate-lock`` (SQLite URLs only). A sidecar file,
    not the database: closing any descriptor of the database would drop SQLite's own locks."""
    path = sqlite_path(url)
    if path is None:
        yield
        return
    fd = os.open(f"{path}.migrate-lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def downgrade(url: str, revision: str) -> None:
    """Migrate the database at ``url`` down to ``revision`` (``base`` drops everything)."""
    command.downgrade(alembic_config(url), revision)


async def upgrade_async(url: str, revision: str = "head") -> None:
    """:func:`upgrade` for use inside a running event loop (runs in a worker thread)."""
    await asyncio.to_thread(upgrade, url, revision)


async def current_async(url: str) -> str | None:
    """The database's revision, or None if it was never migrated (or is at ``base``)."""
    ensure_private_sqlite_file(url)  # a new SQLite file: mode 0600
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(
                lambda sync: MigrationContext.configure(sync).get_current_revision()
            )
    finally:
        await engine.dispose()


def current(url: str) -> str | None:
    """Sync :func:`current_async` (runs its own event loop)."""
    return asyncio.run(current_async(url))


def head() -> str | None:
    """The newest revision shipped with this version of Talaria."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
