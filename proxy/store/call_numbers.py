"""A call's index within its session, unique in the store.

The replica that serves a call numbers it: the session's calls so far
(proxy/callpath/runner.py). Two replicas serving one session at once — only while a balancer moves
sessions between replicas, since both ends name a session by one rule (proxy/cluster/owner.py) —
would number two calls alike. The store refuses a duplicate ``(session_key, call_index)`` (a unique
index), and a batch never writes one: before a new call's row is inserted, its index is checked
against the session's calls already stored and those earlier in the batch, and a taken index becomes
the session's next free one,

    index' = 1 + max(largest index stored for the session, largest given in this batch),

so a session's calls stay numbered without a repeat, in the order the store took them, and
nothing is dropped (the renumbering is logged). Across replicas' concurrent transactions: a
batch locks its sessions' rows first (``SELECT … FOR UPDATE`` in key order on PostgreSQL;
SQLite's writes are serialized anyway), and a batch that inserts a call updates its session's
row, so two batches with calls of one session run one after the other and the second sees
the first's calls.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from sqlalchemy import Table, bindparam, func, select, tuple_
from sqlalchemy.engine import Connection

log = logging.getLogger(__name__)
_IN_CHUNK = 500


class CallNumbers:
    """The indices taken among a batch's sessions: ``load`` the ones its new calls ask for,
    then :meth:`number` each new call in order."""

    def __init__(self, calls: Table) -> None:
        self._calls = calls
        self._taken: set[tuple[str, int]] = set()
        self._largest: dict[str, int] = {}
        """Per session: the largest index stored or given so far (known once looked up)."""
        self._db: Connection | None = None

    def load(self, db: Connection, wanted: Iterable[tuple[str, int]]) -> None:
        """Which of the ``wanted`` (session_key, call_index) pairs the store holds already."""
        self._db = db
        pairs = sorted(set(wanted))
        c = self._calls.c
        query = select(c.session_key, c.call_index).where(
            tuple_(c.session_key, c.call_index).in_(bindparam("pairs", expanding=True))
        )
        for start in range(0, len(pairs), _IN_CHUNK):
            rows = db.execute(query, {"pairs": pairs[start : start + _IN_CHUNK]})
            self._taken.update((key, index) for key, index in rows)

    def number(self, session_key: str, wanted: int, request_id: str) -> int:
        """The index a new call of ``session_key`` is stored with: ``wanted`` if free, else
        the session's next free one (module docstring)."""
        index = wanted
        if (session_key, wanted) in self._taken:
            index = self._largest_of(session_key) + 1
            log.warning(
                "call %s: index %d of session %s was taken (two replicas served it at once): "
                "stored as %d",
                request_id,
                wanted,
                session_key,
                index,
            )
        self._taken.add((session_key, index))
        if session_key in self._largest:
            self._largest[session_key] = max(self._largest[session_key], index)
        return index

    def _largest_of(self, session_key: str) -> int:
        if session_key not in self._largest:
            assert self._db is not None, "load() first"
            stored = self._db.scalar(
                select(func.max(self._calls.c.call_index)).where(
                    self._calls.c.session_key == session_key
                )
            )
            given = [i for key, i in self._taken if key == session_key]
            self._largest[session_key] = max([-1, *given, stored if stored is not None else -1])
        return self._largest[session_key]
