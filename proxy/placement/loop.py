"""The placement controller against live runtimes (issue 28): the replay's ``decide``
(core/placement/controller.py, as sim/placement_driver.py drives it), its moves carried out
over the runtimes' HTTP API (runtime/placement_routes.py).

What one look reads:

- **demand**: each runtime meters the calls it serves — every replica's — with the simulator's
  meter (core/placement/demand.py; ``GET /v1/runtime/demand``): ``d_m`` is the sum over the
  runtimes of the sessions with a call of ``m`` in the last ``window_s`` (a session counts
  once per runtime it called), ``c_m`` the mean engine time (admitted to finished) of its
  calls that finished in it, the runtimes' means weighted by their calls; a runtime whose
  demand does not answer is left out of the look;
- **nodes**: every runtime whose status answers: *hosted*, its models less those it drains,
  plus those this loop adds; *draining*, its ``draining_models``; *budget*, its
  ``weight_budget_bytes``; *live*, each model's ``live_sessions``; *placed*, when this loop
  added a model there; *too small*, the library models its GPU group (status ``server``,
  ``gpus``; ``group_floor``) cannot hold;
- **weights**: a library entry's ``weight_bytes``, else the catalog's, else 0; ``w_m``, ``Q``:
  the largest ``switch_s`` of the model, ``quantum_s``, a runtime reports.

Each look's moves are carried out and recorded by moves.py (``PlacementMoves``).

The controller manages the library's models only: a move of a model the library does not
list is not made (it could not be placed again). Looks run every ``interval_s`` on the
replica that ``leads`` (with replicas, the owner of ``LEADER_KEY`` among the live ones:
proxy/cluster/owner.py), so one replica moves models at a time; a **cold start** (a call for
a library model no runtime hosts) is looked for at once by the replica serving the call, which
waits for its add (``ensure``, at most ``cold_start_timeout_s``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from talaria.core.clock import Clock
from talaria.core.placement import (
    FleetView,
    Move,
    MoveKind,
    NodeView,
    PlacementConfig,
    Reason,
    decide,
)
from talaria.core.placement.keep_alive import keep_alive_s
from talaria.core.status import InstanceStatus
from talaria.proxy.placement.library import FleetDemand, merge_demand
from talaria.proxy.placement.moves import PlacementMoves
from talaria.proxy.placement.target import GroupFloor, PlacementTime, target_of, too_small
from talaria.proxy.runtimes.decoding import PlacementRefused
from talaria.proxy.runtimes.pool import RuntimePool

log = logging.getLogger("talaria.proxy.placement")

LEADER_KEY = "talaria-placement"
"""The key whose owner among the live replicas runs the looks."""
DEFAULT_QUANTUM_S = 60.0
"""``Q`` when no runtime reports its quantum."""
TAKEN_OVER = "taken-over"
"""The recorded reason of a drain this loop took over (moves.py)."""


class ColdStartFailed(RuntimeError):
    """A call's model could not be placed (no room, its engine failed, or too slow)."""


class PlacementLoop:
    """Looks at the live fleet and moves models (module docstring)."""

    def __init__(
        self,
        pool: RuntimePool,
        library: Mapping[str, Mapping[str, Any]],
        catalog_weights: Mapping[str, float],
        config: PlacementConfig,
        clock: Clock,
        *,
        group_floor: GroupFloor = lambda model, server: None,
        placement_s: PlacementTime = lambda weight, server: None,
        leads: Callable[[], bool] = lambda: True,
        cold_start_timeout_s: float = 900.0,
        keep_alive_floor_s: float | None = None,
    ) -> None:
        for runtime in pool.runtimes:
            if not hasattr(runtime, "add_model"):
                raise ValueError(
                    f"placement needs runtime servers reached over HTTP; {runtime.name} is "
                    f"{runtime.kind}"
                )
        self.pool = pool
        self.library = {name: dict(entry) for name, entry in library.items()}
        self.config = config
        self.clock = clock
        self._leads = leads
        self.cold_start_timeout_s = cold_start_timeout_s
        self.keep_alive_floor_s = keep_alive_floor_s
        """The least keep-alive of a library model (core/placement/keep_alive.py); None: no
        model scales to zero."""
        self._weights = {
            name: float(entry.get("weight_bytes") or catalog_weights.get(name, 0.0))
            for name, entry in self.library.items()
        }
        self._catalog_weights = catalog_weights
        self._group_floor = group_floor
        self._placement_s = placement_s
        self.moves = PlacementMoves(pool, self.library, clock, config.drain_s, self._added)
        self.looks = 0
        self._started_s = clock.now()
        self._waiting: dict[str, asyncio.Future[None]] = {}
        self._look_lock = asyncio.Lock()
        self._loop: asyncio.Task[None] | None = None

    # -- the loop -----------------------------------------------------------------------------
    def start(self) -> None:
        """Look every ``interval_s`` from now on (on the leading replica)."""
        self._started_s = self.clock.now()
        self._loop = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Stop looking and cancel the moves under way."""
        tasks = self.moves.cancel()
        if self._loop is not None:
            self._loop.cancel()
            tasks.append(self._loop)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await self.clock.sleep(self.config.interval_s)
            if not self._leads():
                continue
            try:
                await self.look()
            except Exception:  # a runtime's odd answer must not stop the controller
                log.exception("placement: a look failed")

    async def look(self) -> list[Move]:
        """One look: read the fleet, decide, start the moves; returns those started."""
        async with self._look_lock:
            statuses = {s.instance: s for s in await self.pool.statuses(None)}
            demand = await self.demand(list(statuses))
            now = self.clock.now()
            self._take_over_drains(statuses, now)
            view = self.view(now, statuses, demand)
            moves = [m for m in decide(view, self.config) if self._may(m)]
            for move in moves:
                self.moves.apply(move, now)
            self.looks += 1
            return moves

    def _take_over_drains(self, statuses: Mapping[str, InstanceStatus], now: float) -> None:
        """Carry out the drains of library models that runtimes list and this loop is not
        carrying out (moves.py)."""
        for name in statuses:
            target = target_of(self.pool, name)
            for model in sorted(target.draining_models & set(target.models)):
                if model in self.library and (name, model) not in self.moves.draining:
                    self.moves.start(
                        Move(MoveKind.DRAIN, model, name, Reason.MOVE), now, reason=TAKEN_OVER
                    )

    def _may(self, move: Move) -> bool:
        """A move of a model outside the library is not made (module docstring)."""
        if move.model in self.library:
            return True
        log.info(
            "placement: %s of %s on %s not made: not in the library",
            move.kind.value,
            move.model,
            move.node,
        )
        return False

    async def demand(self, runtimes: list[str]) -> FleetDemand:
        """``d_m``, ``c_m`` and idleness over ``runtimes``' demand documents (module
        docstring)."""
        window = self.config.window_s
        answers = await asyncio.gather(
            *(target_of(self.pool, name).demand(window) for name in runtimes),
            return_exceptions=True,
        )
        documents = []
        for name, answer in zip(runtimes, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer  # cancellation is not the runtime's failure
                log.warning("placement: %s's demand: %r", name, answer)
                continue
            documents.append(answer)
        return merge_demand(documents)

    def view(
        self,
        now_s: float,
        statuses: Mapping[str, InstanceStatus],
        demand: FleetDemand,
    ) -> FleetView:
        """The controller's view of the runtimes whose ``statuses`` answered, with the
        demand they measured (module docstring)."""
        nodes = []
        switch_s: dict[str, float] = {}
        quanta = []
        for runtime in self.pool.runtimes:
            status = statuses.get(runtime.name)
            if status is None:
                continue
            target = target_of(self.pool, runtime.name)
            draining = target.draining_models & set(target.models)
            adding = {m for (r, m) in self.moves.adding if r == runtime.name}
            nodes.append(
                NodeView(
                    runtime.name,
                    frozenset((set(target.models) - draining) | adding),
                    frozenset(draining),
                    target.weight_budget_bytes,
                    {m: t for (r, m), t in self.moves.placed_s.items() if r == runtime.name},
                    {m: res.live_sessions for m, res in status.models.items()},
                    too_small(target, self.library, self._group_floor),
                )
            )
            for model, res in status.models.items():
                switch_s[model] = max(switch_s.get(model, 0.0), res.switch_s)
            if target.quantum_s is not None:
                quanta.append(target.quantum_s)
        hosted = {m for node in nodes for m in node.hosted | node.draining}
        weights = {m: self._catalog_weights.get(m, 0.0) for m in hosted} | self._weights
        waiting = {m for m, f in self._waiting.items() if not f.done()}
        return FleetView(
            now_s,
            nodes,
            demand.demand,
            weights,
            unplaced_waiting=frozenset(waiting),
            recent_moves_s=tuple(self.moves.bounded_s),
            measured_s=now_s - self._started_s,
            call_s=demand.call_s,
            switch_s=switch_s,
            quantum_s=max(quanta, default=DEFAULT_QUANTUM_S),
            idle_s=demand.idle_s,
            keep_alive_s=self.keep_alive(demand),
        )

    def keep_alive(self, demand: FleetDemand) -> dict[str, float]:
        """Each library model's keep-alive, learned from its gaps (core/placement/
        keep_alive.py); none without a floor (``keep_alive_floor_s`` None)."""
        floor = self.keep_alive_floor_s
        if floor is None:
            return {}
        window = self.config.window_s
        return {m: keep_alive_s(demand.gap_p99_s.get(m), floor, window) for m in self.library}

    # -- cold starts --------------------------------------------------------------------------
    def expected_cold_start_s(self, model: str) -> float | None:
        """What a cold start of library ``model`` is expected to take: the fastest of the
        runtimes' ``placement_s`` for its weights (weights ÷ the server's storage rate + the
        engine's start), over those whose status says their server; None when none does or
        the library does not list it. A bound below, not a promise: the look, a runtime's
        queue of adds and a real engine's start come on top."""
        if model not in self.library:
            return None
        weight = self._weights.get(model, 0.0)
        times = [
            t
            for runtime in self.pool.runtimes
            if (server := target_of(self.pool, runtime.name).server) is not None
            and (t := self._placement_s(weight, server)) is not None
        ]
        return min(times, default=None)

    async def ensure(self, model: str) -> bool:
        """For a call of ``model``, which no runtime hosts: False if the library does not
        list it; else True once a runtime serves it, after a cold start (``ColdStartFailed``
        if none could be made, the engine failed, or it took ``cold_start_timeout_s``)."""
        if model not in self.library:
            return False
        waiting = self._waiting.get(model)
        if waiting is None or waiting.done():
            waiting = asyncio.get_running_loop().create_future()
            waiting.add_done_callback(_retrieve)
            self._waiting[model] = waiting
            try:
                await self.look()
            except Exception as exc:  # the call gets the reason, not a 500
                log.exception("placement: the look for %s's cold start failed", model)
                self._settle(model, ColdStartFailed(f"the placement look failed: {exc!r}"))
            placed_meanwhile = model in self.pool.models()  # e.g. another replica's move
            if placed_meanwhile or not any(m == model for (_, m) in self.moves.adding):
                failed = ColdStartFailed(f"no runtime has room for {model}")
                self._settle(model, None if placed_meanwhile else failed)
        try:
            await asyncio.wait_for(asyncio.shield(waiting), self.cold_start_timeout_s)
        except TimeoutError as exc:
            raise ColdStartFailed(
                f"{model} was not placed within {self.cold_start_timeout_s:g} s"
            ) from exc
        return True

    def _added(self, model: str, refused: PlacementRefused | None) -> None:
        """An add of ``model`` ended: placed (``refused`` None), else the runtime's refusal."""
        self._settle(model, None if refused is None else ColdStartFailed(str(refused)))

    def _settle(self, model: str, error: Exception | None) -> None:
        waiting = self._waiting.pop(model, None)
        if waiting is None or waiting.done():
            return
        if error is None:
            waiting.set_result(None)
        else:
            waiting.set_exception(error)

    # -- what the admin API shows -------------------------------------------------------------
    async def summary(self) -> dict[str, Any]:
        """The library, each runtime's models (and those draining or being added), the
        demand now, the looks and every move."""
        fleet = await self.demand([r.name for r in self.pool.runtimes])
        return {
            "library": sorted(self.library),
            "runtimes": {
                r.name: {
                    "models": list(r.models),
                    "draining": sorted(r.draining_models),
                    "adding": sorted(m for (n, m) in self.moves.adding if n == r.name),
                }
                for r in self.pool.runtimes
            },
            "demand": fleet.demand,
            "call_s": fleet.call_s,
            "idle_s": fleet.idle_s,
            "keep_alive_s": dict(sorted(self.keep_alive(fleet).items())),
            "looks": self.looks,
            "moves": [asdict(r) for r in self.moves.records],
            "config": asdict(self.config),
        }


def _retrieve(future: asyncio.Future[None]) -> None:
    """Mark a cold start's failure seen (a call that stopped waiting leaves nobody to)."""
    if not future.cancelled():
        future.exception()
