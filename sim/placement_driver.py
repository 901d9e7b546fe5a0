"""The placement controller in a replay: it measures demand, looks every ``interval_s``, and
carries out the moves on the simulated nodes (issue 28).

- **demand**: ``d_m`` is the number of sessions that sent model ``m`` a call within the last
  ``window_s`` (the calls are seen as they arrive), and ``c_m`` the mean duration (admitted
  to finished) of its calls that finished within it (core/placement/demand.py, which a live
  proxy can feed the same way);
- **add**: the weights come from a peer hosting the model (the fabric) or from storage, then
  the engine starts (``ServerSpec.placement_s``); copies into one node run one after another;
  the model is routed to once they end (``PlacementTable.ready``);
- **evict**: an idle model leaves its node at once (``NodeScheduler.retire``); until it has,
  its weights still count against the node's budget and it cannot be placed there again;
- **drain**: the node takes no new session of the model; once its sessions there have ended,
  or ``drain_s`` has passed (they move), the model is retired;
- **cold start**: a call whose model has no replica waits for one (the controller looks at
  once); the time calls wait so is kept (``cold_wait_s``).

Engine start is charged as time before the model serves, not as GPU time on the node (an
assumption in placement's favour, stated in docs/results.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from talaria.core.catalog import Catalog
from talaria.core.clock import Clock
from talaria.core.groups import group_floor
from talaria.core.placement import (
    DemandMeter,
    FleetView,
    Move,
    MoveKind,
    PlacementConfig,
    PlacementTable,
    Reason,
    decide,
)
from talaria.core.types import CallRequest, CallResult
from talaria.runtime.costmodel import CostModel
from talaria.runtime.memory.sizing import pinned_weight_budget_bytes
from talaria.runtime.scheduling.node import NodeScheduler
from talaria.runtime.sim_node import NodeSetup, add_sim_model

DRAIN_POLL_S = 15.0
"""How often a drain looks whether its node's sessions of the model have ended."""


@dataclass(frozen=True)
class MoveRecord:
    """One move carried out: when, what, why, from where, and how long its copy took."""

    at_s: float
    kind: str
    model: str
    node: str
    reason: str
    source: str | None
    seconds: float


def _too_small(catalog: Catalog, setup: NodeSetup) -> frozenset[str]:
    """The catalog's models that a node's GPU group cannot hold (their smallest group is
    larger: core/groups.py ``group_floor``)."""
    gpus = setup.gpus or catalog.server(setup.server).gpus
    floors = {m: group_floor(catalog, m, setup.server) for m in catalog.models}
    return frozenset(m for m, floor in floors.items() if floor is not None and floor > gpus)


class PlacementDriver:
    """The replay's placement driver (module docstring). ``live(node, model)`` counts the
    sessions whose last call ran on ``node``; the dispatcher provides it."""

    def __init__(
        self,
        nodes: Mapping[str, NodeScheduler],
        setups: Mapping[str, NodeSetup],
        catalog: Catalog,
        clock: Clock,
        config: PlacementConfig,
        table: PlacementTable,
        quantum_s: float,
    ) -> None:
        self.nodes = nodes
        self.setups = setups
        self.catalog = catalog
        self.clock = clock
        self.config = config
        self.table = table
        self.quantum_s = quantum_s
        self.budget_bytes = {
            n: pinned_weight_budget_bytes(s.server_spec(catalog)) for n, s in setups.items()
        }
        """Each node's pinned-weight budget: its GPU group's share (runtime/memory/sizing.py)."""
        self.too_small = {n: _too_small(catalog, s) for n, s in setups.items()}
        """Each node's models its GPU group cannot hold (core/groups.py): never added there."""
        server = catalog.server(next(iter(setups.values())).server)
        profile = catalog.profile(next(iter(setups.values())).profile)
        self._switch_s = {
            m: CostModel(spec, server, profile).weight_wake_time_s()
            for m, spec in catalog.models.items()
        }
        """``w_m``: a full wake of the model's weights over PCIe (the engine's switch-in)."""
        self.live: Callable[[], Mapping[tuple[str, str], int]] = dict
        self.records: list[MoveRecord] = []
        self.cold_wait_s = 0.0
        """Seconds calls spent waiting for a cold start, summed over calls."""
        self.cold_waits = 0
        self.meter = DemandMeter(config.window_s)
        """``d_m`` and ``c_m`` (core/placement/demand.py)."""
        self._started_s = 0.0
        self._bounded_s: list[float] = []
        self._unplaced: dict[str, asyncio.Event] = {}
        self._copy_free_s = dict.fromkeys(nodes, 0.0)
        self._tasks: set[asyncio.Task[None]] = set()
        self._failures: list[BaseException] = []
        self._loop: asyncio.Task[None] | None = None

    # -- demand ------------------------------------------------------------------------------
    def observe(self, request: CallRequest) -> None:
        """A call arrived: its session counts for its model's demand for a window."""
        self.meter.arrived(self.clock.now(), request.model, request.session_key)

    def finished(self, result: CallResult) -> None:
        """A call finished: its duration counts for its model's ``c_m`` for a window."""
        seconds = result.finished_s - result.admitted_s
        self.meter.finished(result.finished_s, result.model, seconds)

    # -- the loop ----------------------------------------------------------------------------
    def start(self) -> None:
        """Look every ``interval_s`` from now on."""
        self._started_s = self.clock.now()
        self._loop = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop looking and cancel moves under way; a look or a move that failed raises here
        (a controller that died must not pass for one that chose to do nothing)."""
        tasks = [t for t in [self._loop, *self._tasks] if t is not None]
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                self._failures.append(task.exception())  # type: ignore[arg-type]
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._failures:
            raise RuntimeError("the placement driver failed") from self._failures[0]

    async def _run(self) -> None:
        while True:
            await self.clock.sleep(self.config.interval_s)
            self.look()

    def look(self) -> list[Move]:
        """One look of the controller, its moves carried out (started)."""
        now = self.clock.now()
        weights = {m: self.catalog.model(m).weight_bytes for m in self.catalog.models}
        view = FleetView(
            now,
            self.table.views(self.live(), self.budget_bytes, self.too_small),
            self.meter.demand(now),
            weights,
            unplaced_waiting=frozenset(self._unplaced),
            recent_moves_s=tuple(self._bounded_s),
            measured_s=now - self._started_s,
            call_s=self.meter.call_s(now),
            quantum_s=self.quantum_s,
            switch_s=self._switch_s,
        )
        moves = decide(view, self.config)
        for move in moves:
            self._apply(move, now)
        return moves

    async def ensure(self, model: str) -> None:
        """Wait until some node serves ``model`` (a cold start if none hosts it)."""
        start = self.clock.now()
        event = self._unplaced.setdefault(model, asyncio.Event())
        if not self.table.hosts(model):
            self.look()
        await event.wait()
        self.cold_waits += 1
        self.cold_wait_s += self.clock.now() - start

    # -- moves -------------------------------------------------------------------------------
    def _apply(self, move: Move, now: float) -> None:
        if move.reason in (Reason.SCALE_OUT, Reason.SCALE_IN, Reason.MOVE):
            self._bounded_s.append(now)
        if move.kind is MoveKind.ADD:
            spec = self.catalog.model(move.model)
            server = self.catalog.server(self.setups[move.node].server)
            seconds = server.placement_s(spec.weight_bytes, from_peer=move.source is not None)
            begin = max(now, self._copy_free_s[move.node])
            ready = begin + seconds
            self._copy_free_s[move.node] = ready
            self.table.receive(move.node, move.model, ready, now)
            self._spawn(self._add(move, ready))
        elif move.kind is MoveKind.EVICT:
            self.table.drain(move.node, move.model, now)
            self._spawn(self._retire(move.node, move.model))
            seconds = 0.0
        else:
            self.table.drain(move.node, move.model, now)
            self._spawn(self._drain(move.node, move.model))
            seconds = 0.0
        m = move
        self.records.append(
            MoveRecord(now, m.kind.value, m.model, m.node, m.reason.value, m.source, seconds)
        )

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._settled)

    def _settled(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._failures.append(task.exception())  # type: ignore[arg-type]

    async def _add(self, move: Move, ready_s: float) -> None:
        await self.clock.sleep(ready_s - self.clock.now())
        add_sim_model(self.nodes[move.node], self.setups[move.node], move.model, self.catalog)
        self.table.ready(move.node, move.model)
        event = self._unplaced.pop(move.model, None)
        if event is not None:
            event.set()

    async def _drain(self, node: str, model: str) -> None:
        while self.live().get((node, model), 0) > 0:
            if self.table.drain_expired(node, model, self.clock.now()):
                break
            await self.clock.sleep(DRAIN_POLL_S)
        self.table.expire(node, model)
        await self._retire(node, model)

    async def _retire(self, node: str, model: str) -> None:
        """Retire the model from the node; the table forgets it once its memory is free."""
        await self.nodes[node].retire(model, self.catalog.model(model).weight_bytes)
        self.table.remove(node, model)

    # -- results -----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Moves by reason, the seconds of copies, the cold starts' waits, every move, the
        final layout and the controller's settings."""
        by_reason: dict[str, int] = {}
        for r in self.records:
            by_reason[r.reason] = by_reason.get(r.reason, 0) + 1
        return {
            "moves_by_reason": dict(sorted(by_reason.items())),
            "copy_s_total": sum(r.seconds for r in self.records),
            "cold_waits": self.cold_waits,
            "cold_wait_s_total": self.cold_wait_s,
            "moves": [asdict(r) for r in self.records],
            "final_layout": {n: list(ms) for n, ms in self.table.layout().items()},
            "config": asdict(self.config),
        }
