"""The slot loop of one node: the plan (the next resident set), closing and renewing slots, and
the transitions between resident sets.

Each pass computes the *plan* from the calls waiting for models that are not resident (none:
uncontended, nothing closes):

- resident models in the plan (*staying*) admit as in an uncontended slot;
- resident models not in the plan (*leaving*) follow the contended-slot rules (slot batch, SP
  budget, the slot's deadline) and, once the slot closes (quantum or idle), drain;
- models in the plan that are not resident (*incoming*) are activated once the leaving ones
  have drained (at once when none leaves: they fit beside the residents).

A transition (deactivate, make room, activate) runs as a task of its own, so staying models
keep serving through it. With ``d2d_staging`` the first incoming model's weights are staged
into free HBM while the slot runs.
"""

from __future__ import annotations

import asyncio

from talaria.runtime.engine import Engine
from talaria.runtime.scheduling.intake import Intake
from talaria.runtime.scheduling.slots import (
    CloseReason,
    Demand,
    DemandPolicy,
    close_reason,
    next_model,
    next_model_by_demand,
    resident_set,
    slot_length_s,
)
from talaria.runtime.scheduling.state import NodeState


class SlotLoop:
    """The node's scheduling loop (``run``): admit, plan, close or switch, stage, sleep until
    an arrival, a finish, the slot's deadline or a reservation's expiry."""

    def __init__(self, state: NodeState, intake: Intake) -> None:
        self.state = state
        self.engines = state.engines
        self.order = state.order
        self.flags = state.flags
        self.config = state.config
        self.slot = state.slot
        self.holds = state.holds
        self.intake = intake
        self._clock = state.clock
        self._demand_policy = DemandPolicy(state.config.quantum_s)
        self.transition: asyncio.Task[None] | None = None
        """The transition under way, if any."""

    # -- demand and the plan -----------------------------------------------------------------
    def demands(self, now: float) -> dict[str, Demand]:
        """Per model: queued calls, the age of the oldest, and the sessions in a tool gap
        (nothing queued or running, not stale) expected back within a quantum."""
        horizon = now + self.config.quantum_s
        back = dict.fromkeys(self.order, 0)
        for session in self.state.sessions.in_gap(now, self.state.stale_window_s()):
            assert session.last_finish_s is not None
            if session.last_finish_s + session.expected_gap_s() <= horizon:
                back[session.model] = back.get(session.model, 0) + 1
        return {
            m: Demand(len(q), back.get(m, 0), now - q[0].arrival_s if q else 0.0)
            for m, q in self.state.waiting.items()
        }

    def plan(self) -> list[str] | None:
        """The next resident set (the slot's model first), or None when no model outside the
        resident set has a waiting call (uncontended)."""
        waiting = self.state.waiting_counts()
        resident = self.slot.resident
        outside = {m: n for m, n in waiting.items() if n > 0 and m not in resident}
        if not outside:
            return None
        demands: dict[str, Demand] = {}
        if self.flags.demand_slots or self.flags.co_residency:
            demands = self.demands(self._clock.now())
        if self.flags.demand_slots:
            eligible = {m: d for m, d in demands.items() if d.waiting > 0}
            first = next_model_by_demand(
                self.order, self.slot.active, eligible, self._demand_policy
            )
        else:
            first = next_model(self.order, self.slot.active, outside)
        assert first is not None
        if not self.flags.co_residency:
            return [first]
        return resident_set(
            first,
            resident,
            demands,
            {m: e.weight_bytes for m, e in self.engines.items()},
            {m: e.kv_floor_bytes() for m, e in self.engines.items()},
            self.state.memory.hbm_capacity_bytes,
            self.config.quantum_s,
        )

    def leaving_in(self, plan: list[str] | None) -> frozenset[str]:
        """The resident models the plan does not keep."""
        if plan is None:
            return frozenset()
        return frozenset(m for m in self.slot.resident if m not in plan)

    # -- the loop --------------------------------------------------------------------------
    async def run(self) -> None:
        """Schedule until cancelled."""
        wake = self.state.wake
        while True:
            wake.clear()
            self.holds.expire(self._clock.now())
            if self.transition is not None:
                self.intake.admit_waiting(self.leaving_in(self.plan()))
                await self._clock.wait_event(wake, self._next_timer_s(None))
                continue
            if not self.slot.resident:
                model = next_model(self.order, None, self.state.waiting_counts())
                if model is None:
                    await self._clock.wait_event(wake, None)
                    continue
                self._begin_transition(self.plan() or [model])
                continue
            self.intake.admit_waiting(self.leaving_in(self.plan()))
            plan = self.plan()
            if self._step_slot(plan):
                continue
            self._stage_next(plan)
            await self._clock.wait_event(wake, self._next_timer_s(plan))

    def _step_slot(self, plan: list[str] | None) -> bool:
        """Close, renew or change the slot as the plan says; True when a transition began."""
        slot = self.slot
        if plan is None:
            if slot.leaving:  # the calls it closed for went away: the slot goes on
                slot.leaving.clear()
                self._open_slot(slot.resident, 0.0, ())
            return False
        leaving = self.leaving_in(plan)
        incoming = [m for m in plan if m not in slot.resident]
        if not leaving:
            slot.leaving.clear()
            if incoming:  # they fit beside the residents: no slot needs to close
                self._begin_transition(plan)
                return True
            if self._clock.now() >= slot.deadline_s():
                self._renew_slot(plan, CloseReason.QUANTUM)
            return False
        if not slot.leaving:
            reason = self._close_reason(leaving)
            if reason is None:
                return False
            slot.close(self._clock.now(), reason)
        slot.leaving = set(leaving)
        if any(self.engines[m].running for m in leaving):
            return False  # the leaving models drain first
        self._begin_transition(plan)
        return True

    def _next_timer_s(self, plan: list[str] | None) -> float | None:
        timers = [self.holds.table.next_expiry_s()]
        if plan is not None and self.slot.active is not None and not self.slot.leaving:
            timers.append(self.slot.deadline_s())  # a closed slot waits for its drain instead
        pending = [t for t in timers if t is not None]
        return max(0.0, min(pending) - self._clock.now()) if pending else None

    def _close_reason(self, leaving: frozenset[str]) -> CloseReason | None:
        view = self.intake.view(leaving)
        waiting = self.state.waiting
        return close_reason(
            now_s=self._clock.now(),
            deadline_s=self.slot.deadline_s(),
            contended=True,
            running=sum(self.engines[m].running for m in leaving),
            admissible_waiting=any(
                self.intake.decide(w, view) is not False for m in leaving for w in waiting[m]
            ),
            live_reservations=sum(len(self.holds.table.for_model(m)) for m in leaving),
        )

    # -- slots and transitions -----------------------------------------------------------------
    def _renew_slot(self, plan: list[str], reason: CloseReason) -> None:
        """The slot's quantum ran out, but the plan keeps every resident: a new slot, no
        switch."""
        self.slot.close(self._clock.now(), reason)
        self._open_slot(plan, 0.0, ())

    def _open_slot(self, plan: list[str], switch_s: float, activated: tuple[str, ...]) -> None:
        """A new slot for ``plan[0]``: Q long, or demand-sized with ``demand_slots``."""
        now = self._clock.now()
        length = self.config.quantum_s
        if self.flags.demand_slots:
            length = slot_length_s(plan[0], self.demands(now), self._demand_policy)
        self.slot.open(plan, now, length, switch_s, activated)

    def _begin_transition(self, plan: list[str]) -> None:
        self.transition = asyncio.get_running_loop().create_task(self._switch(plan))

    async def _switch(self, plan: list[str]) -> None:
        """Deactivate the drained leaving models, make room, activate the incoming ones, and
        open the plan's slot. Staying models keep serving meanwhile."""
        slot = self.slot
        try:
            start = self._clock.now()
            leaving = [m for m in slot.resident if m not in plan]
            incoming = [m for m in plan if m not in slot.resident]
            slot.resident = [m for m in slot.resident if m in plan]
            if slot.active not in slot.resident:
                slot.active = None
            for model in leaving:
                self.holds.release_model(model)
                slot.serving_since.pop(model, None)
                await self.engines[model].deactivate(
                    keep_kv_on_host=self.flags.host_kv,
                    keep_host_weight_copy=self.flags.d2d_staging,
                )
            slot.leaving.clear()
            for name, engine in self.engines.items():
                if name not in incoming:
                    engine.cancel_staging()
            extend = bool(slot.records) and slot.active == plan[0] and not leaving
            for model in incoming:
                await self._make_room(self.engines[model])
                await self.engines[model].activate()
                slot.resident.append(model)
                slot.resident.sort(key=plan.index)
                slot.serving_since[model] = self._clock.now()
                if extend:  # the slot goes on; the model joins it
                    slot.records[-1].activated += (model,)
                    slot.records[-1].co_resident = tuple(slot.resident[1:])
                else:  # the slot opens as soon as its first model is in; others join it
                    self._open_slot(plan, self._clock.now() - start, (model,))
                    extend = True
                self.state.wake.set()
            if not extend:
                self._open_slot(plan, self._clock.now() - start, ())
        finally:
            self.transition = None
            slot.hold = False
            self.state.wake.set()

    async def _make_room(self, engine: Engine) -> None:
        """Wait until the engine's weights fit: release the residents' reservations on the
        way, and hold every admission while running calls still pin the room it needs."""
        while not engine.can_activate():
            for model in self.slot.resident:
                self.holds.release_model(model)
            if engine.can_activate():
                return
            self.slot.hold = True
            self.state.call_done.clear()
            await self._clock.wait_event(self.state.call_done, None)
        self.slot.hold = False

    def _stage_next(self, plan: list[str] | None) -> None:
        """With ``d2d_staging``, stage the first incoming model's weights (and no other's)."""
        if not self.flags.d2d_staging or self.slot.active is None or plan is None:
            return
        incoming = [m for m in plan if m not in self.slot.resident]
        if not incoming:
            return
        target = incoming[0]
        for name, engine in self.engines.items():
            if name != target and not engine.active:
                engine.cancel_staging()
        self.engines[target].start_staging()
