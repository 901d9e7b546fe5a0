"""Database URLs and engines: SQLite (aiosqlite) by default, PostgreSQL (asyncpg) by URL."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import platformdirs
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

DATA_DIR_ENV = "TALARIA_DATA_DIR"
DATABASE_URL_ENV = "TALARIA_DATABASE_URL"


def data_dir() -> Path:
    """Where Talaria keeps its data: ``$TALARIA_DATA_DIR``, else the user data dir (created)."""
    configured = os.environ.get(DATA_DIR_ENV)
    path = Path(configured) if configured else Path(platformdirs.user_data_dir("talaria"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_sqlite_url() -> str:
    """``sqlite+aiosqlite:///<data dir>/talaria.db``."""
    return f"sqlite+aiosqlite:///{data_dir() / 'talaria.db'}"


def default_url() -> str:
    """``$TALARIA_DATABASE_URL`` if set, else :func:`default_sqlite_url`."""
    return os.environ.get(DATABASE_URL_ENV) or default_sqlite_url()


def is_sqlite(url: str) -> bool:
    """Whether ``url`` names a SQLite database."""
    return make_url(url).get_backend_name() == "sqlite"


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """Per connection: WAL (readers never block the writer), fsync at checkpoints only, and
    enforced foreign keys (SQLite leaves them off by default)."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def make_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """An async engine for ``url``; extra keyword arguments go to ``create_async_engine``.

    SQLite gets WAL, ``synchronous=NORMAL`` and foreign keys on every connection; PostgreSQL
    gets ``pool_pre_ping`` so connections dropped by a server restart are replaced.
    """
    if is_sqlite(url):
        engine = create_async_engine(url, **kwargs)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_async_engine(url, **kwargs)


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions that keep loaded objects usable after commit."""
    return async_sessionmaker(engine, expire_on_commit=False)
