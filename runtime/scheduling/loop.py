"""The slot loop of one node: the plan (next resident set), slots, transitions between sets.

Each pass computes the *plan* from the calls waiting for models that are not resident (none:
uncontended, nothing closes):

- resident models in the plan (*staying*) admit as in an uncontended slot;
- resident models not in the plan (*leaving*) follow the contended-slot rules (slot batch, SP
  budget, the slot's deadline) and, once the slot closes (quantum or idle), drain;
- models in the plan that are not resident (*incoming*) are activated once the leaving ones
  have drained (at once when none leaves: they fit beside the residents).

The plan and the slot's length are the node's slot planner's (policies/planner.py), what a
switch keeps and whether the next model's weights are staged during the slot its switch
policy's (policies/switching.py). A transition (deactivate, make room, activate) is a task of
its own (staying models serve on).

``SlotLoop`` alone changes the slot (``SlotState``), the transition under way and the holds
(``KvHolds``); others read ``slot`` (a ``SlotStateView``) and ``holds``; the intake gets both
in each pass's ``AdmissionView`` and hands back what it admitted; the node asks through
``retire`` (a model leaves once its calls are gone and no transition runs), ``hold`` and
``release_hold``.
"""

from __future__ import annotations

import asyncio
import math

from talaria.core.holds import HoldTable, ReleaseReason
from talaria.core.types import CallResult
from talaria.runtime.scheduling.driven import DrivenEngine
from talaria.runtime.scheduling.holds import KvHolds
from talaria.runtime.scheduling.intake import AdmissionView, Intake
from talaria.runtime.scheduling.policies.compose import NodePolicies
from talaria.runtime.scheduling.policies.planner import PlanView
from talaria.runtime.scheduling.sessions import NodeSession, SessionsView
from talaria.runtime.scheduling.slots import (
    CloseReason,
    Demand,
    best_class,
    close_reason,
    next_model,
)
from talaria.runtime.scheduling.state import NodeContext, SlotState, SlotStateView


class SlotLoop:
    """The node's scheduling loop (``run``): admit, plan, close or switch, stage, sleep until
    an arrival, a finish, the slot's deadline or a hold's expiry. It owns the slot, the
    transition under way and the holds (the module docstring)."""

    def __init__(
        self,
        context: NodeContext,
        intake: Intake,
        sessions: SessionsView,
        holds: KvHolds,
        policies: NodePolicies,
    ) -> None:
        self.context = context
        self.intake = intake
        self.sessions = sessions
        self.policies = policies
        self.config = context.config
        self._slot = SlotState(length_s=context.config.quantum_s)
        self._holds = holds
        self._clock = context.clock
        self._transition: asyncio.Task[None] | None = None
        self._idle_from: dict[str, float] = {}
        """With a planner's keep-alive: each resident model's time since it has had no call
        running (the pass a call ends in runs at its end: the call's end wakes the loop)."""

    @property
    def slot(self) -> SlotStateView:
        """The current slot and the resident set, read-only."""
        return self._slot

    @property
    def holds(self) -> HoldTable:
        """The node's holds (read them; they change through this loop)."""
        return self._holds.table

    # -- demand and the plan -----------------------------------------------------------------
    def demands(self, now: float) -> dict[str, Demand]:
        """Per model: queued calls, the age of the oldest, and the sessions in a tool gap
        (nothing queued or running, not stale) expected back within a quantum."""
        horizon = now + self.config.quantum_s
        back = dict.fromkeys(self.context.order, 0)
        work: dict[str, dict[str, int]] = {}  # tenant → model → calls waiting + sessions back
        weights: dict[str, float] = {}
        for session in self.sessions.in_gap(now, self.context.stale_window_s()):
            assert session.last_finish_s is not None
            if session.last_finish_s + session.expected_gap_s() <= horizon:
                back[session.model] = back.get(session.model, 0) + 1
                per_model = work.setdefault(session.tenant, {})
                per_model[session.model] = per_model.get(session.model, 0) + 1
                weights[session.tenant] = session.tenant_weight
        shared = self.policies.queue.weighed_work(work, weights, self.intake.waiting)
        return {
            m: Demand(
                len(q),
                back.get(m, 0),
                now - q[0].arrival_s if q else 0.0,
                None if shared is None else shared.get(m, 0.0),
            )
            for m, q in self.intake.waiting.items()
        }

    def plan(self) -> list[str] | None:
        """The next resident set (the slot's model first), or None when no model outside the
        resident set has a waiting call (uncontended)."""
        waiting = self.intake.waiting_counts()
        resident = self._slot.resident
        outside = {m: n for m, n in waiting.items() if n > 0 and m not in resident}
        if not outside:
            return None
        now = self._clock.now()
        return self.policies.planner.plan(
            PlanView(
                order=self.context.order,
                active=self._slot.active,
                resident=resident,
                outside=outside,
                demand_of=lambda: self.demands(now),
                best_waiting=self.intake.best_waiting_class,
                engines=self.context.engines,
                capacity_bytes=self.context.memory.hbm_capacity_bytes,
            )
        )

    def leaving_in(self, plan: list[str] | None) -> frozenset[str]:
        """The resident models the plan does not keep."""
        if plan is None:
            return frozenset()
        return frozenset(m for m in self._slot.resident if m not in plan)

    # -- the loop --------------------------------------------------------------------------
    async def run(self) -> None:
        """Schedule until cancelled."""
        signals = self.context.signals
        while True:
            signals.clear_poke()
            self._holds.expire(self._clock.now())
            if self._transition is not None:
                self._admit(self.leaving_in(self.plan()))
                await signals.next_poke(self._next_timer_s(None))
                continue
            if not self._slot.resident:
                model = next_model(self.context.order, None, self.intake.waiting_counts())
                if model is None:
                    await signals.next_poke(None)
                    continue
                self._begin_transition(self.plan() or [model])
                continue
            self._admit(self.leaving_in(self.plan()))
            if self.policies.planner.keep_alive_s > 0:
                self._note_idle()
            plan = self.plan()
            if self._step_slot(plan):
                continue
            self._stage_next(plan)
            await signals.next_poke(self._next_timer_s(plan))

    def _admission_view(self, leaving: frozenset[str]) -> AdmissionView:
        """What the pass's admission decisions read of the slot: during a memory hold every
        resident model is closing."""
        slot = self._slot
        closing = frozenset(slot.resident) if slot.hold else frozenset(slot.leaving)
        now, table, holds = self._clock.now(), self._holds.table, self._holds
        return AdmissionView(
            leaving, closing, slot.deadline_s() - now, slot.start_s, slot.serving_since,
            lambda key, counts: table.held_bytes(key, counts, now),
            lambda request, fits: holds.make_room(request, fits, now),
        )  # fmt: skip

    def _admit(self, leaving: frozenset[str]) -> None:
        """One admission pass over the resident models' queues (none before a slot), its
        admissions counted in the slot's record."""
        slot = self._slot
        if not slot.resident or not slot.records:
            return
        admitted, sp_admitted = self.intake.admit_waiting(
            list(slot.resident), self._admission_view(leaving)
        )
        slot.records[-1].admitted += admitted
        slot.records[-1].sp_admitted += sp_admitted

    def _step_slot(self, plan: list[str] | None) -> bool:
        """Close, renew or change the slot as the plan says; True when a transition began."""
        slot = self._slot
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
        if any(self.context.engines[m].running for m in leaving):
            return False  # the leaving models drain first
        self._begin_transition(plan)
        return True

    def _note_idle(self) -> None:
        """Keep ``_idle_from`` for the resident models (a planner's keep-alive)."""
        now = self._clock.now()
        for model in self._slot.resident:
            if self.context.engines[model].running:
                self._idle_from.pop(model, None)
            else:
                self._idle_from.setdefault(model, now)

    def _kept_alive_until(self, leaving: frozenset[str]) -> float | None:
        """When the keep-alive of the leaving models ends (the last of them to go idle): None
        without a planner's keep-alive or while one of them runs a call."""
        keep = self.policies.planner.keep_alive_s
        if keep <= 0 or any(m not in self._idle_from for m in leaving):
            return None
        return max(self._idle_from[m] for m in leaving) + keep

    def _next_timer_s(self, plan: list[str] | None) -> float | None:
        timers = [self._holds.table.next_change_s(self._clock.now())]
        if plan is not None and self._slot.active is not None and not self._slot.leaving:
            timers.append(self._slot.deadline_s())  # a closed slot waits for its drain instead
            timers.append(self._kept_alive_until(self.leaving_in(plan)))
        pending = [t for t in timers if t is not None and t < math.inf]
        return max(0.0, min(pending) - self._clock.now()) if pending else None

    def _close_reason(self, leaving: frozenset[str]) -> CloseReason | None:
        view = self._admission_view(leaving)
        waiting = self.intake.waiting
        elapsed = self._clock.now() - self._slot.start_s
        if self.policies.queue.closes_slot(self._classes, elapsed):
            return CloseReason.OUTRANKED
        now = self._clock.now()
        kept = self._kept_alive_until(leaving)
        if kept is not None and now < kept:
            return None  # a serverless instance's keep-alive: it keeps the GPUs
        return close_reason(
            now_s=now,
            deadline_s=self._slot.deadline_s(),
            contended=True,
            running=sum(self.context.engines[m].running for m in leaving),
            admissible_waiting=any(
                self.intake.decide(w, view) is not False for m in leaving for w in waiting[m]
            ),
            live_holds=sum(self._holds.table.keeping_slot(m, now) for m in leaving),
        )

    def _classes(self) -> tuple[int | None, int | None]:
        """The best class waiting outside the resident set, and the best the slot serves
        (running or waiting on its models)."""
        slot = self._slot
        classes = self.intake.best_waiting_class()
        outside = best_class([r for m, r in classes.items() if m not in slot.resident])
        serving = best_class(
            [r for m, r in classes.items() if m in slot.resident]
            + [r for m in slot.resident for r in self.intake.running_classes(m)]
        )
        return outside, serving

    # -- slots and transitions -----------------------------------------------------------------
    def _renew_slot(self, plan: list[str], reason: CloseReason) -> None:
        """The slot's quantum ran out, but the plan keeps every resident: a new slot, no
        switch."""
        self._slot.close(self._clock.now(), reason)
        self._open_slot(plan, 0.0, ())

    def _open_slot(self, plan: list[str], switch_s: float, activated: tuple[str, ...]) -> None:
        """A new slot for ``plan[0]``, as long as the planner says (Q, or demand-sized)."""
        now = self._clock.now()
        length = self.policies.planner.slot_length_s(plan[0], lambda: self.demands(now))
        self._slot.open(plan, now, length, switch_s, activated)
        for model in activated:
            self._idle_from.pop(model, None)

    def _begin_transition(self, plan: list[str]) -> None:
        self._transition = asyncio.get_running_loop().create_task(self._switch(plan))

    async def _switch(self, plan: list[str]) -> None:
        """Deactivate the drained leaving models, make room, activate the incoming ones, and
        open the plan's slot. Staying models keep serving meanwhile."""
        slot = self._slot
        try:
            start = self._clock.now()
            leaving = [m for m in slot.resident if m not in plan]
            incoming = [m for m in plan if m not in slot.resident]
            slot.resident = [m for m in slot.resident if m in plan]
            if slot.active not in slot.resident:
                slot.active = None
            for model in leaving:
                self._holds.release_model(model)
                slot.serving_since.pop(model, None)
                await self.policies.switch.deactivate(self.context.engines[model])
            slot.leaving.clear()
            for name, engine in self.context.engines.items():
                if name not in incoming:
                    engine.cancel_staging()
            extend = bool(slot.records) and slot.active == plan[0] and not leaving
            for model in incoming:
                await self._make_room(self.context.engines[model])
                await self.context.engines[model].activate()
                slot.resident.append(model)
                slot.resident.sort(key=plan.index)
                slot.serving_since[model] = self._clock.now()
                if extend:  # the slot goes on; the model joins it
                    slot.records[-1].activated += (model,)
                    slot.records[-1].co_resident = tuple(slot.resident[1:])
                else:  # the slot opens as soon as its first model is in; others join it
                    self._open_slot(plan, self._clock.now() - start, (model,))
                    extend = True
                self.context.signals.poke()
            if not extend:
                self._open_slot(plan, self._clock.now() - start, ())
        finally:
            self._transition = None
            slot.hold = False
            self.context.signals.poke()

    async def _make_room(self, engine: DrivenEngine) -> None:
        """Wait until the engine's weights fit: release the residents' holds on the
        way, and hold every admission while running calls still pin the room it needs."""
        while not engine.can_activate():
            for model in self._slot.resident:
                self._holds.release_model(model)
            if engine.can_activate():
                return
            self._slot.hold = True
            await self.context.signals.next_call_end(None)
        self._slot.hold = False

    def _stage_next(self, plan: list[str] | None) -> None:
        """During a slot, the switch policy may stage the plan's first incoming model."""
        if self._slot.active is None or plan is None:
            return
        incoming = [m for m in plan if m not in self._slot.resident]
        self.policies.switch.stage(self.context.engines, incoming)

    # -- what the node asks of the loop ----------------------------------------------------
    async def retire(self, model: str) -> None:
        """``model`` leaves the node (``NodeScheduler.retire``): wait until no call of it waits
        or runs and no transition is under way, then take it out of the resident set and put
        it to sleep if resident (its weights released, its sessions' KV dropped)."""
        engine = self.context.engines[model]
        while self.intake.waiting[model] or engine.running or self._transition is not None:
            await self.context.signals.next_call_end(self.config.quantum_s)
        slot = self._slot
        if model in slot.resident:
            slot.resident.remove(model)
            slot.leaving.discard(model)
            slot.serving_since.pop(model, None)
            await engine.deactivate(keep_kv_on_host=False, keep_host_weight_copy=True)
            if slot.active == model:
                slot.active = slot.resident[0] if slot.resident else None

    async def cancel_transition(self) -> None:
        """Cancel the transition under way, if any (the node stops)."""
        task = self._transition
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._transition = None

    def hold(
        self, result: CallResult, session: NodeSession, gap_s: float, hold_s: float | None = None
    ) -> None:
        """The hold policy's hold: after ``result``, the session holds for its next
        call (``KvHolds.hold``: expected in ``gap_s``, its KV held ``hold_s``: None, the slack),
        until the slot's deadline when the plan has its model leave."""
        leaving = self.leaving_in(self.plan())
        deadline = self._slot.deadline_s() if result.model in leaving else None
        self._holds.hold(
            result,
            session,
            self.context.engines[result.model],
            expected_gap_s=gap_s,
            deadline_s=deadline,
            default_output_tokens=self.config.default_output_tokens,
            hold_gap_s=hold_s,
        )

    def release_hold(self, session_key: str, reason: ReleaseReason) -> None:
        """Release the session's hold, if it has one (it returned, moved or ended)."""
        self._holds.release(session_key, reason)
