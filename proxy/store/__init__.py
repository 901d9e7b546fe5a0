"""The session store: SQLAlchemy models, engines, ``SqlStore`` (the batched writes and one
object per group of tables: repository.py), the batched writer, and the Alembic migrations
that create the schema (``talaria.migrations``). Records map to rows by their field names
(mapping.py).

SQLite through aiosqlite by default (``db.default_sqlite_url()``); PostgreSQL through asyncpg
when given a ``postgresql+asyncpg://`` URL.
"""

from talaria.proxy.store.db import default_sqlite_url, default_url, make_engine, make_sessionmaker
from talaria.proxy.store.repository import SqlStore
from talaria.proxy.store.views import ApiKeyInfo, SessionDetail, SessionPage, SessionSummary
from talaria.proxy.store.writer import BatchWriter

__all__ = [
    "ApiKeyInfo",
    "BatchWriter",
    "SessionDetail",
    "SessionPage",
    "SessionSummary",
    "SqlStore",
    "default_sqlite_url",
    "default_url",
    "make_engine",
    "make_sessionmaker",
]
