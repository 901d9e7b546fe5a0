"""What the store can tell about its own health: whether an error means the records are refused
(content) or the database is unavailable (transient), and whether the SQLite file the proxy
opened is still the file at its path.

SQLite keeps writing to a database file after it was deleted or replaced (the open descriptor
still points to the old inode), so without a check every record written afterwards would be
silently lost. :class:`SqliteFileGuard` remembers the file's (device, inode) when the proxy
starts; the store checks it before every batch and on ``/readyz``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.exc import DataError, IntegrityError

from talaria.proxy.store.db import sqlite_path

CONTENT_SQLSTATE_CLASSES = ("22", "23")
"""SQLSTATE classes of errors caused by the data itself: 22 data exception (e.g. 22021, a byte
sequence such as NUL that the encoding cannot hold), 23 integrity constraint violation
(PostgreSQL documentation, Appendix A, "PostgreSQL Error Codes")."""


class StoreFileGone(OSError):
    """The SQLite database file was deleted or replaced since the proxy opened it."""


def is_content_error(exc: BaseException) -> bool:
    """Whether ``exc`` from a write means the records themselves are refused, so retrying the
    same records can never succeed: SQLAlchemy's ``DataError`` / ``IntegrityError``, or a
    driver error whose SQLSTATE is of class 22 or 23. Everything else (connection refused,
    disk full, a locked or missing file) is transient."""
    if isinstance(exc, DataError | IntegrityError):
        return True
    orig = getattr(exc, "orig", None)
    code = getattr(orig, "pgcode", None) or getattr(orig, "sqlstate", None)
    return isinstance(code, str) and code[:2] in CONTENT_SQLSTATE_CLASSES


@dataclass(frozen=True)
class SqliteFileGuard:
    """The identity of a SQLite file when it was opened."""

    path: Path
    device: int
    inode: int

    @classmethod
    def of(cls, url: str) -> SqliteFileGuard | None:
        """A guard for the (existing) file of ``url``; None when ``url`` is not a SQLite file."""
        path = sqlite_path(url)
        if path is None:
            return None
        stat = path.stat()
        return cls(path.resolve(), stat.st_dev, stat.st_ino)

    def check(self) -> None:
        """Raise :class:`StoreFileGone` if the file is missing or is another file now."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            raise StoreFileGone(f"the database file {self.path} was deleted") from None
        if (stat.st_dev, stat.st_ino) != (self.device, self.inode):
            raise StoreFileGone(f"the database file {self.path} was replaced by another file")
