"""Database URLs and engines: SQLite (aiosqlite) by default, PostgreSQL (asyncpg) by URL."""

from __future__ import annotations

import logging
import os
import stat
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

log = logging.getLogger(__name__)

DATA_DIR_ENV = "TALARIA_DATA_DIR"
DATABASE_URL_ENV = "TALARIA_DATABASE_URL"


def data_dir() -> Path:
    """Where Talaria keeps its data: ``$TALARIA_DATA_DIR``, else the user data dir (created
    with mode 0700 if missing; an existing directory keeps its mode)."""
    configured = os.environ.get(DATA_DIR_ENV)
    path = Path(configured) if configured else Path(platformdirs.user_data_dir("talaria"))
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        if not path.is_dir():
            raise
    else:
        os.chmod(path, 0o700)  # whatever the umask
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


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL; None for other databases, in-memory and ``file:`` URIs."""
    parsed = make_url(url)
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    if database.startswith("file:"):
        return None
    return Path(database)


def ensure_private_sqlite_file(url: str) -> None:
    """Before SQLite opens ``url``'s file: create it empty with mode 0600 if it does not exist
    (SQLite then creates its -wal and -shm files with the same mode). An existing file keeps its
    mode, with a warning if group or others may read or write it. Other URLs: nothing."""
    path = sqlite_path(url)
    if path is None:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning(
                "the database file %s has mode %04o: others than its owner can access it "
                "(chmod 600 %s)",
                path,
                mode,
                path,
            )
        return
    except FileNotFoundError:  # no such directory: SQLite reports it when it opens the file
        return
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
    finally:
        os.close(fd)


def sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
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

    A new SQLite file is created with mode 0600 (:func:`ensure_private_sqlite_file`). SQLite
    gets WAL, ``synchronous=NORMAL`` and foreign keys on every connection; PostgreSQL
    gets ``pool_pre_ping`` so connections dropped by a server restart are replaced.
    """
    if is_sqlite(url):
        ensure_private_sqlite_file(url)
        engine = create_async_engine(url, **kwargs)
        event.listen(engine.sync_engine, "connect", sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_async_engine(url, **kwargs)


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions that keep loaded objects usable after commit."""
    return async_sessionmaker(engine, expire_on_commit=False)


class TableGroup:
    """One group of the store's tables, read and written over ``sessionmaker``; ``SqlStore``
    (repository.py) holds one of each."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession]) -> None:
        self._sessionmaker = sessionmaker
