"""The placement loop's moves carried out (loop.py decides them) over the runtimes' HTTP API
(runtime/placement_routes.py), each in a task of its own and recorded (``records``), and what
is under way, which the loop's next look reads (``adding``, ``draining``, ``placed_s``,
``bounded_s``):

- **add**: the model's ``[[model]]`` entry from the library (``weight_bytes`` left out) is
  POSTed to the runtime; its engine starts there from the entry's ``path`` (a live runtime
  loads from storage whatever source the controller chose), one add into a runtime at a time;
- **evict**: ``DELETE`` at once (the runtime retires the model once its calls are done);
- **drain**: the runtime marks the model draining (no proxy routes a new session to it there
  while another runtime serves it: ``RuntimePool.routable``), then ``DELETE`` once its live
  sessions there are gone or ``drain_s`` has passed. A drain this loop did not begin (the
  replica that began it gone) is taken over at the next look (reason ``taken-over``), its
  ``drain_s`` counted from then, so that no model is left draining for good. A ``DELETE`` of
  a model the runtime no longer hosts (404: another replica removed it) ends the drain too;
  one the runtime refuses otherwise is recorded as failed and not taken over again here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from talaria.core.clock import Clock
from talaria.core.placement import Move, MoveKind, Reason
from talaria.proxy.placement.library import LIBRARY_ONLY_KEYS
from talaria.proxy.placement.target import LiveMove, target_of
from talaria.proxy.runtimes.decoding import PlacementRefused
from talaria.proxy.runtimes.pool import RuntimePool

log = logging.getLogger("talaria.proxy.placement")

DRAIN_POLL_S = 15.0
"""How often a drain reads whether its runtime's sessions of the model have ended."""
BOUNDED = (Reason.SCALE_OUT, Reason.SCALE_IN, Reason.MOVE)


class PlacementMoves:
    """The moves of one placement loop, under way and made (module docstring).
    ``on_added(model, refused)`` runs when an add ends (``refused`` None: the model is placed
    there; else the runtime's refusal), for the cold starts that wait on it."""

    def __init__(
        self,
        pool: RuntimePool,
        library: Mapping[str, Mapping[str, Any]],
        clock: Clock,
        drain_s: float,
        on_added: Callable[[str, PlacementRefused | None], None],
    ) -> None:
        self.pool = pool
        self.library = library
        self.clock = clock
        self.drain_s = drain_s
        self._on_added = on_added
        self.records: list[LiveMove] = []
        self.bounded_s: list[float] = []
        """When the moves of the last hour that the controller bounds (``BOUNDED``) began."""
        self.adding: dict[tuple[str, str], float] = {}
        """(runtime, model) → when this loop began adding it."""
        self.draining: set[tuple[str, str]] = set()
        """(runtime, model): the drains this loop began or took over and has not removed."""
        self.placed_s: dict[tuple[str, str], float] = {}
        self._copy_locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def cancel(self) -> list[asyncio.Task[None]]:
        """Cancel the moves under way; their tasks, for the caller to await."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return tasks

    def apply(self, move: Move, now: float) -> None:
        """Start a move the controller decided (a bounded one counted in ``bounded_s``)."""
        if move.reason in BOUNDED:
            self.bounded_s = [t for t in self.bounded_s if now - t < 3600.0] + [now]
        self.start(move, now, reason=move.reason.value)

    def start(self, move: Move, now: float, *, reason: str) -> None:
        """Record ``move`` with ``reason`` and carry it out in a task of its own."""
        record = LiveMove(now, move.kind.value, move.model, move.node, reason)
        self.records.append(record)
        index = len(self.records) - 1
        if move.kind is MoveKind.ADD:
            self.adding[(move.node, move.model)] = now
            self._spawn(self._add(move, index))
        elif move.kind is MoveKind.EVICT:
            self._spawn(self._remove(move.node, move.model, index))
        else:
            self.draining.add((move.node, move.model))
            self._spawn(self._drain(move.node, move.model, index))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _ended(self, index: int, outcome: str) -> None:
        record = self.records[index]
        seconds = self.clock.now() - record.at_s
        self.records[index] = LiveMove(**{**asdict(record), "outcome": outcome, "seconds": seconds})

    async def _add(self, move: Move, index: int) -> None:
        entry = {k: v for k, v in self.library[move.model].items() if k not in LIBRARY_ONLY_KEYS}
        lock = self._copy_locks.setdefault(move.node, asyncio.Lock())
        try:
            async with lock:  # one add into a runtime at a time
                await target_of(self.pool, move.node).add_model(entry)
        except PlacementRefused as exc:
            log.error("placement: adding %s to %s failed: %s", move.model, move.node, exc)
            self._ended(index, f"failed: {exc}")
            self._on_added(move.model, exc)
        else:
            self.placed_s[(move.node, move.model)] = self.clock.now()
            self._ended(index, "ok")
            self._on_added(move.model, None)
        finally:
            self.adding.pop((move.node, move.model), None)

    async def _drain(self, runtime: str, model: str, index: int) -> None:
        target = target_of(self.pool, runtime)
        began = self.clock.now()
        try:
            await target.drain_model(model)
        except PlacementRefused as exc:
            log.error("placement: draining %s on %s failed: %s", model, runtime, exc)
            self._ended(index, f"failed: {exc}")
            return
        while self.clock.now() - began < self.drain_s:
            try:
                live = (await target.status()).models.get(model)
            except Exception as exc:  # unreachable for now: keep waiting out the drain
                log.warning("placement: %s's status during a drain: %r", runtime, exc)
                live = None
            if live is not None and live.live_sessions == 0:
                break
            await self.clock.sleep(DRAIN_POLL_S)
        await self._remove(runtime, model, index)

    async def _remove(self, runtime: str, model: str, index: int) -> None:
        try:
            await target_of(self.pool, runtime).remove_model(model)
        except PlacementRefused as exc:
            if exc.status != 404:  # 404: another replica removed it meanwhile
                log.error("placement: removing %s from %s failed: %s", model, runtime, exc)
                self._ended(index, f"failed: {exc}")  # and not taken over again
                return
        self.placed_s.pop((runtime, model), None)
        self.draining.discard((runtime, model))
        self._ended(index, "ok")
