"""The order in which a node's idle session KV is evicted, kept as entries come and go rather
than sorted from every entry at each admission (issue 46: with the HBM full of idle KV, as an
LRU cache is, every admission sorted all of a node's entries, so a call's cost grew with the
sessions the node keeps).

The order is ``NodeMemory.evictable``'s: the lowest class first (the highest ``rank``), then
the least recently used (``last_used_s``), then the key. One heap per tier holds a tuple
(−rank, last_used_s, key) per entry, pinned or not. Nothing has to tell it of a pin or of a
later ``last_used_s`` (the engines and the holds change those fields in place): a walk checks
each tuple it takes against its entry, skips a pinned one, drops one whose entry left the tier,
and puts one whose entry was used since back at its new place (``last_used_s`` only grows, so
a stale tuple is only ever early). A walk takes the tuples it visits and puts them back, so it
costs O((visited + repaired) · log n), not O(n log n).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Mapping
from typing import Protocol, TypeVar

Key = tuple[float, float, str]


class Evictable(Protocol):
    """What the order reads of a KV entry (``resources.SessionKv``)."""

    @property
    def session_key(self) -> str: ...

    @property
    def location(self) -> object: ...

    @property
    def last_used_s(self) -> float: ...

    @property
    def rank(self) -> int: ...

    @property
    def nbytes(self) -> float: ...

    @property
    def pinned(self) -> bool:
        """A call or a hold keeps it."""
        ...


Entry = TypeVar("Entry", bound=Evictable)


def order_key(entry: Evictable) -> Key:
    """(−rank, last_used_s, key): the lowest class, then the least recently used, first."""
    return (-entry.rank, entry.last_used_s, entry.session_key)


class EvictionOrder:
    """Per tier, the node's KV entries in eviction order (module docstring)."""

    def __init__(self) -> None:
        self._heaps: dict[object, list[Key]] = {}

    def queue(self, entry: Evictable) -> None:
        """``entry`` is (again) in its tier: a new entry, or one that moved."""
        heap = self._heaps.setdefault(entry.location, [])
        heapq.heappush(heap, order_key(entry))

    def take(
        self,
        location: object,
        kv: Mapping[str, Entry],
        enough_bytes: float,
        keep: Collection[str | None] = (),
    ) -> list[Entry]:
        """The unpinned entries of ``location`` in eviction order (but those of ``keep``), from
        the first until their bytes reach ``enough_bytes`` (all of them if they never do)."""
        heap = self._heaps.get(location)
        if not heap:
            return []
        taken: list[Key] = []
        seen: set[str] = set()
        found: list[Entry] = []
        total = 0.0
        while heap and total < enough_bytes:
            item = heapq.heappop(heap)
            key = item[2]
            entry = kv.get(key)
            if entry is None or entry.location != location or key in seen:
                continue  # it left the tier (or this is a duplicate): the tuple goes
            current = order_key(entry)
            if current != item:  # used since: back at its place
                heapq.heappush(heap, current)
                continue
            seen.add(key)
            taken.append(item)
            if entry.pinned or key in keep:
                continue
            found.append(entry)
            total += entry.nbytes
        for item in taken:
            heapq.heappush(heap, item)
        if len(heap) > 2 * len(kv) + 1024:  # mostly stale tuples: rebuild
            self._heaps[location] = [order_key(e) for e in kv.values() if e.location == location]
            heapq.heapify(self._heaps[location])
        return found
