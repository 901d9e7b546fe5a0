"""Dead letters: where records go that the database will not take, so that nothing is lost.

- :meth:`DeadLetters.keep`: a record the database refused for its content (the writer's
  quarantine). It goes to the ``dead_letters`` table; if even that write fails, to the file.
- :meth:`DeadLetters.spill`: records still queued when the proxy must stop and the database
  cannot take them in time (a store outage during shutdown). They go to the file directly.

The file is JSON lines (``dead-letters.jsonl`` in the data directory, next to the default
SQLite file): one object per record, ``{"at", "reason", "error", "kind", "record"}``. Its text
is ASCII (``json.dumps`` escapes NUL and everything non-ASCII), so any database takes it back.
``GET /admin/dead-letters`` lists the table; the file is read with any JSON-lines tool.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from talaria.proxy.contract.records import Record
from talaria.proxy.store.db import TableGroup
from talaria.proxy.store.health import SqliteFileGuard
from talaria.proxy.store.mapping import from_row
from talaria.proxy.store.models import DeadLetter
from talaria.proxy.store.views import DeadLetterView

log = logging.getLogger(__name__)

DEAD_LETTER_FILE = "dead-letters.jsonl"


class DeadLetterStore(Protocol):
    """Where :class:`DeadLetters` keeps refused records first (:class:`DeadLetterTable`)."""

    async def write_dead_letter(self, kind: str, payload: str, error: str, at: datetime) -> None:
        """Keep one refused record."""
        ...


class DeadLetterTable(TableGroup):
    """The ``dead_letters`` table. With a ``guard`` (a SQLite file), every write first checks
    that the file is still the one the proxy opened (health.py)."""

    def __init__(
        self, sessionmaker: async_sessionmaker[AsyncSession], guard: SqliteFileGuard | None = None
    ) -> None:
        super().__init__(sessionmaker)
        self._guard = guard

    async def write_dead_letter(self, kind: str, payload: str, error: str, at: datetime) -> None:
        """Keep a refused record (``payload``: its JSON, ASCII only)."""
        if self._guard is not None:
            self._guard.check()
        async with self._sessionmaker() as db, db.begin():
            db.add(DeadLetter(created_at=at, kind=kind, payload=payload, error=error))

    async def list_dead_letters(self, limit: int = 100) -> list[DeadLetterView]:
        """The newest dead letters first."""
        query = select(DeadLetter).order_by(DeadLetter.id.desc()).limit(limit)
        async with self._sessionmaker() as db:
            return [from_row(DeadLetterView, r) for r in await db.scalars(query)]


def record_json(record: Record) -> str:
    """The record as ASCII JSON (datetimes as ISO strings)."""
    return json.dumps(dataclasses.asdict(record), default=_jsonable, sort_keys=True)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return repr(value)


def _error_text(error: BaseException | str) -> str:
    return (error if isinstance(error, str) else repr(error))[:2000].replace("\x00", "\\x00")


class DeadLetters:
    """Keeps refused and unwritable records: in ``store``'s table, else in the file at
    ``path`` (created 0600: records carry session ids and hints)."""

    def __init__(self, store: DeadLetterStore, path: Path) -> None:
        self._store = store
        self.path = path

    async def keep(self, record: Record, error: BaseException) -> None:
        """Keep a record the database refused for its content."""
        kind, payload, text = type(record).__name__, record_json(record), _error_text(error)
        now = datetime.now(UTC)
        try:
            await self._store.write_dead_letter(kind, payload, text, now)
        except Exception as exc:
            log.error("the dead-letter table failed too (%r); keeping it in %s", exc, self.path)
            self._append([(kind, payload)], "refused", text, now)

    def spill(self, records: Sequence[Record], reason: str, error: str = "") -> Path | None:
        """Append ``records`` to the file (blocking; for shutdown). Returns the path, or None
        when there was nothing to keep."""
        if not records:
            return None
        entries = [(type(r).__name__, record_json(r)) for r in records]
        self._append(entries, reason, _error_text(error), datetime.now(UTC))
        return self.path

    def _append(
        self, entries: Sequence[tuple[str, str]], reason: str, error: str, at: datetime
    ) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="ascii") as out:
            for kind, payload in entries:
                entry = {"at": at.isoformat(), "reason": reason, "error": error, "kind": kind}
                out.write(json.dumps({**entry, "record": json.loads(payload)}) + "\n")
            out.flush()
            os.fsync(out.fileno())
