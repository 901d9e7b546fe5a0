"""What the engines of one node share: HBM and host-DRAM byte accounting, the PCIe link, and
the GPUs' time (``DeviceShare``).

HBM holds the resident models' weights, any staged weights of the next model, and session KV
(``KvLocation.HBM``). Host DRAM holds the pinned weight copies of every hosted model (outside
the KV tier) and the host KV tier (``KvLocation.HOST``). Both tiers refuse to go over capacity:
callers evict first; an overflow is a bug and raises ``CapacityError``.
"""

from __future__ import annotations

import heapq
import itertools
from asyncio import CancelledError, Event, Future, get_running_loop
from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum

from talaria.core.clock import Clock
from talaria.runtime.memory.eviction import EvictionOrder
from talaria.runtime.memory.host_weights import HostWeights


class CapacityError(RuntimeError):
    """A tier would go over capacity."""


class KvLocation(StrEnum):
    """The tier a session's KV is in."""

    HBM = "hbm"
    HOST = "host"


@dataclass
class SessionKv:
    """The cached KV of one session: ``tokens`` of prefix, ``nbytes`` physical bytes."""

    session_key: str
    model: str
    tokens: int
    nbytes: float
    location: KvLocation
    last_used_s: float
    pins: int = 0  # > 0 while a call runs on it or a hold keeps it
    rank: int = 1
    """Its session's class (``Priority.rank``: 0 interactive … 2 batch): a lower class's KV is
    evicted first (``NodeMemory.evictable``)."""

    @property
    def pinned(self) -> bool:
        """A call runs on it or a hold keeps it: eviction skips it."""
        return self.pins > 0


class NodeMemory:
    """Byte accounting of one node's HBM (weights + KV) and host KV tier."""

    def __init__(self, hbm_capacity_bytes: float, host_kv_capacity_bytes: float) -> None:
        self.hbm_capacity_bytes = hbm_capacity_bytes
        self.host_kv_capacity_bytes = max(0.0, host_kv_capacity_bytes)
        self.weights: dict[str, float] = {}
        self.staged: dict[str, float] = {}
        self.kv: dict[str, SessionKv] = {}
        self._hbm_kv_bytes = 0.0
        self._host_kv_bytes = 0.0
        self.peak_hbm_bytes = 0.0
        self.peak_host_kv_bytes = 0.0
        self._changes: set[str] | None = None
        self._order = EvictionOrder()
        self.host_weights = HostWeights()
        """The pinned host weight copies (host_weights.py); every model has one unless
        ``node_memory`` found them over the budget."""

    def watch(self) -> set[str]:
        """A set that collects, from now on, the key of every session whose KV entry is put,
        resized, moved or dropped (every key held now to begin with); its reader empties it
        (node_status.py keeps the status's KV map up to date from it). Without a reader
        nothing is collected."""
        if self._changes is None:
            self._changes = set(self.kv)
        return self._changes

    def _changed(self, session_key: str) -> None:
        if self._changes is not None:
            self._changes.add(session_key)

    # -- totals ----------------------------------------------------------------------------
    @property
    def hbm_used_bytes(self) -> float:
        """Weights + staged weights + KV in HBM."""
        return sum(self.weights.values()) + sum(self.staged.values()) + self._hbm_kv_bytes

    @property
    def hbm_kv_bytes(self) -> float:
        """Session KV in HBM."""
        return self._hbm_kv_bytes

    @property
    def host_kv_bytes(self) -> float:
        """Session KV in the host tier."""
        return self._host_kv_bytes

    def hbm_free_bytes(self) -> float:
        """HBM capacity − HBM used."""
        return self.hbm_capacity_bytes - self.hbm_used_bytes

    def host_free_bytes(self) -> float:
        """Host KV tier capacity − host KV used."""
        return self.host_kv_capacity_bytes - self._host_kv_bytes

    def _check(self) -> None:
        used = self.hbm_used_bytes
        if used > self.hbm_capacity_bytes * (1 + 1e-12):
            raise CapacityError(f"HBM over capacity: {used:.4g} > {self.hbm_capacity_bytes:.4g}")
        if self._host_kv_bytes > self.host_kv_capacity_bytes * (1 + 1e-12):
            raise CapacityError("host KV tier over capacity")
        self.peak_hbm_bytes = max(self.peak_hbm_bytes, used)
        self.peak_host_kv_bytes = max(self.peak_host_kv_bytes, self._host_kv_bytes)

    def resize_host_kv(self, delta_bytes: float) -> None:
        """The host KV tier grows by ``delta_bytes`` (shrinks if negative: a model's pinned
        weight copy arrives); shrinking drops the least recently used unpinned host KV until
        the tier fits (``CapacityError`` if pinned KV alone exceeds it)."""
        self.host_kv_capacity_bytes = max(0.0, self.host_kv_capacity_bytes + delta_bytes)
        over = self._host_kv_bytes - self.host_kv_capacity_bytes
        for entry in self.take_evictable(KvLocation.HOST, over):
            if self._host_kv_bytes <= self.host_kv_capacity_bytes:
                break
            self.drop(entry.session_key)
        self._check()

    # -- weights ---------------------------------------------------------------------------
    def load_weights(self, model: str, nbytes: float) -> None:
        """The model's weights are in HBM (replacing any staged copy)."""
        self.staged.pop(model, None)
        self.weights[model] = nbytes
        self._check()

    def unload_weights(self, model: str) -> None:
        """The model's weights left HBM."""
        self.weights.pop(model, None)

    def keep_host_copy(self, model: str, now: float) -> bool:
        """Try to give ``model``, whose weights are only on NVMe, a pinned host copy (by
        expected demand, ``HostWeights.keep``); the host KV tier shrinks by what it takes."""
        change = self.host_weights.keep(model, now, self.host_free_bytes())
        if change is None:
            return False
        self.resize_host_kv(change)
        return True

    def stage(self, model: str, nbytes: float) -> None:
        """``nbytes`` of the model's weights are staged in free HBM (``d2d_staging``)."""
        self.staged[model] = nbytes
        self._check()

    def unstage(self, model: str) -> None:
        """The model's staged weights are dropped."""
        self.staged.pop(model, None)

    # -- session KV ------------------------------------------------------------------------
    def _add(self, entry: SessionKv, sign: float) -> None:
        if entry.location is KvLocation.HBM:
            self._hbm_kv_bytes += sign * entry.nbytes
        else:
            self._host_kv_bytes += sign * entry.nbytes

    def put(self, entry: SessionKv) -> None:
        """Insert or replace a session's entry (the old bytes are released first)."""
        old = self.kv.pop(entry.session_key, None)
        if old is not None:
            self._add(old, -1)
        self.kv[entry.session_key] = entry
        self._add(entry, +1)
        self._changed(entry.session_key)
        self._order.queue(entry)
        self._check()

    def resize(self, session_key: str, tokens: int, nbytes: float) -> None:
        """The session's KV now holds ``tokens`` in ``nbytes`` (same tier)."""
        entry = self.kv[session_key]
        self._add(entry, -1)
        entry.tokens, entry.nbytes = tokens, nbytes
        self._add(entry, +1)
        self._changed(session_key)
        self._check()

    def move(self, session_key: str, location: KvLocation) -> None:
        """The session's KV moved to ``location`` (offload or restore)."""
        entry = self.kv[session_key]
        self._add(entry, -1)
        entry.location = location
        self._add(entry, +1)
        self._changed(session_key)
        self._order.queue(entry)
        self._check()

    def drop(self, session_key: str) -> SessionKv | None:
        """Forget the session's KV; the entry it had, if any."""
        entry = self.kv.pop(session_key, None)
        if entry is not None:
            self._add(entry, -1)
            self._changed(session_key)
        return entry

    def take_evictable(
        self, location: KvLocation, enough_bytes: float, keep: Collection[str | None] = ()
    ) -> list[SessionKv]:
        """The first entries of ``evictable(location)`` (but those of ``keep``) whose bytes
        reach ``enough_bytes``, or all of them if they never do; none for ``enough_bytes``
        ≤ 0. It walks only those and the pinned ones before them (eviction.py), where
        ``evictable`` sorts every entry: what admission and eviction ask."""
        return self._order.take(location, self.kv, enough_bytes, keep)

    def evictable(self, location: KvLocation, model: str | None = None) -> list[SessionKv]:
        """Unpinned entries in ``location`` (of ``model`` if given) in eviction order: the
        lowest class first (the highest ``rank``), then least recently used first (a sort of
        every entry: ``take_evictable`` walks only the first)."""
        found = [
            e
            for e in self.kv.values()
            if e.location is location and not e.pinned and (model is None or e.model == model)
        ]
        return sorted(found, key=lambda e: (-e.rank, e.last_used_s, e.session_key))


class PcieLink:
    """The node's host↔GPU link as one shared resource: transfers run one at a time, lower
    ``priority`` first (KV restores and offloads at 0 go before weight staging at 1), FIFO
    within a priority. A transfer's duration is computed by the caller from the cost model."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._busy = False
        self._waiters: list[tuple[int, int, Future[None]]] = []
        self._order = itertools.count()
        self.busy_s = 0.0
        self.bytes_moved = 0.0

    async def transfer(self, seconds: float, nbytes: float, priority: int = 0) -> None:
        """Wait for the link (lower ``priority`` first), then hold it for ``seconds``."""
        if self._busy:
            fut: Future[None] = get_running_loop().create_future()
            heapq.heappush(self._waiters, (priority, next(self._order), fut))
            try:
                await fut
            except CancelledError:
                if fut.done() and not fut.cancelled():
                    self._release()  # we were handed the link, then cancelled: pass it on
                raise
        self._busy = True
        try:
            await self._clock.sleep(seconds)
            self.busy_s += seconds
            self.bytes_moved += nbytes
        finally:
            self._release()

    def _release(self) -> None:
        self._busy = False
        while self._waiters:
            _, _, nxt = heapq.heappop(self._waiters)
            if not nxt.done():
                self._busy = True
                nxt.set_result(None)
                return


class DeviceShare:
    """The node's GPUs as co-resident engines share them.

    Without MPS, kernels of different processes never run at the same time: the GPU time-slices
    between their contexts (docs/sources.md §4, "Engines sharing a GPU"). Device time therefore
    adds up: a step whose device part takes ``t − t_host`` alone takes

        t' = t_host + (t − t_host) × (1 + α·k)

    while k other engines are busy, the host part ``t_host`` (scheduling, sampling on the CPU)
    overlapping. α = 1 is processor sharing (work-conserving); the profile's
    ``coresident_interference`` gives α, measured by ``talaria calibrate`` where engines can
    co-reside (e.g. vLLM's CPU build, engines sharing a core). An engine is busy while it has
    ready sequences; when that changes, the other busy engines are woken to re-time their
    remaining steps.
    """

    def __init__(self) -> None:
        self._busy: dict[str, Event] = {}

    def set_busy(self, engine: str, busy: bool, wake: Event) -> None:
        """The engine has ready sequences (``busy``) or none; on a change the other busy
        engines' ``wake`` events are set so they re-time their steps."""
        if busy == (engine in self._busy):
            return
        if busy:
            self._busy[engine] = wake
        else:
            del self._busy[engine]
        for other, event in self._busy.items():
            if other != engine:
                event.set()

    def others_busy(self, engine: str) -> int:
        """k: how many other engines are busy."""
        return sum(1 for other in self._busy if other != engine)

    def stretch(
        self, engine: str, step_s: float, host_s: float, interference: float = 1.0
    ) -> float:
        """t_host + (t − t_host) × (1 + α·k), α = ``interference``, k = the other busy
        engines (formula above)."""
        k = self.others_busy(engine)
        if k == 0 or step_s <= 0:
            return step_s
        host = min(host_s, step_s)
        return host + (step_s - host) * (1 + interference * k)
