"""Admission of waiting calls into the resident engines, and serving the admitted ones.

One pass per scheduler wake-up: for each resident model, its FIFO of waiting calls in arrival
order. Each call gets the verdict of ``admission.decide_admission`` (slot batch, uncontended,
SP budget, or wait); an admissible call must then fit in memory (``admission.fits_memory``:
needed ≤ free HBM + staged weights + evictable idle KV − other sessions' reserved bytes) and be
taken by its engine (``Engine.try_admit``, which commits its memory and evicts). A call that
waits for memory stops its model's pass: later calls never overtake it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace

from talaria.core.types import CallRejected, CallRequest, CallResult, Finished
from talaria.runtime.engine import Admission, Engine
from talaria.runtime.scheduling.admission import decide_admission, fits_memory
from talaria.runtime.scheduling.resources import KvLocation
from talaria.runtime.scheduling.state import NodeState, WaitingCall


class CallTooLargeError(RuntimeError):
    """The call needs more KV memory than the node can ever give it."""


@dataclass(frozen=True)
class AdmissionView:
    """What every admission decision of one pass shares (computed once per pass)."""

    leaving: frozenset[str]
    """Resident models not in the plan: they follow the contended-slot rules."""
    closing: frozenset[str]
    """Models that admit nothing: draining before they leave, or all during a memory hold."""
    remaining_s: float
    """Time left before the slot's deadline (the SP time budget)."""


class Intake:
    """The admission pass over the waiting queues, and the tasks serving admitted calls."""

    def __init__(
        self, state: NodeState, on_finished: Callable[[CallRequest, CallResult], None]
    ) -> None:
        self.name = state.name
        self.engines = state.engines
        self.memory = state.memory
        self.flags = state.flags
        self.config = state.config
        self.waiting = state.waiting
        self.sessions = state.sessions
        self.holds = state.holds
        self.slot = state.slot
        self._clock = state.clock
        self._wake = state.wake
        self._call_done = state.call_done
        self._on_finished = on_finished
        self._calls: set[asyncio.Task[None]] = set()

    def view(self, leaving: frozenset[str]) -> AdmissionView:
        """The pass's shared inputs: during a memory hold every resident model is closing."""
        slot = self.slot
        closing = frozenset(slot.resident) if slot.hold else frozenset(slot.leaving)
        return AdmissionView(leaving, closing, slot.deadline_s() - self._clock.now())

    def decide(self, waiting: WaitingCall, view: AdmissionView) -> bool | None:
        """True: admit; False: keep waiting; None: admit as SP."""
        request = waiting.request
        engine = self.engines[request.model]
        # A call queued before its session ended (e.g. by a final call) keeps a fresh record.
        session = self.sessions.get_or_add(request.session_key, request.model)
        default_out = self.config.default_output_tokens
        decision = decide_admission(
            sp_admission=self.flags.sp_admission,
            closing=request.model in view.closing,
            in_slot_batch=waiting.arrival_s <= self.slot.start_s,
            contended=request.model in view.leaving,
            is_continuation=session.calls > 0,
            remaining_s=view.remaining_s,
            estimate_service_s=lambda: engine.estimate_service_s(
                request, session.expected_output_tokens(default_out)
            ),
        )
        if not decision.admit:
            return False
        return None if decision.sp else True

    def admit_waiting(self, leaving: frozenset[str]) -> None:
        """One admission pass over every resident model's queue (nothing before a slot)."""
        if not self.slot.resident or not self.slot.records:
            return
        view = self.view(leaving)
        for model in list(self.slot.resident):
            self._admit_model(model, view)

    def _fits(self, engine: Engine, request: CallRequest) -> bool:
        evictable = sum(
            e.nbytes
            for e in self.memory.lru(KvLocation.HBM)
            if e.session_key != request.session_key
        )
        return fits_memory(
            needed_bytes=engine.needed_bytes(request),
            free_bytes=self.memory.hbm_free_bytes() + sum(self.memory.staged.values()),
            evictable_bytes=evictable,
            reserved_bytes=self.holds.table.held_bytes(exclude_session=request.session_key),
        )

    def _is_hopeless(self, engine: Engine, request: CallRequest) -> bool:
        """The call needs more KV than the HBM left beside its model's weights."""
        return engine.needed_bytes(request) > self.memory.hbm_capacity_bytes - engine.weight_bytes

    def _cancel_staging(self) -> None:
        """Admission needs the room: cancel every inactive engine's staging."""
        for engine in self.engines.values():
            if not engine.active:
                engine.cancel_staging()

    def _admit_model(self, model: str, view: AdmissionView) -> None:
        engine = self.engines[model]
        queue = self.waiting[model]
        for waiting in list(queue):
            verdict = self.decide(waiting, view)
            if verdict is False:
                continue
            if self._is_hopeless(engine, waiting.request):
                queue.remove(waiting)
                waiting.result.set_exception(
                    CallTooLargeError(
                        f"call needs {engine.needed_bytes(waiting.request):.3g} B of KV; "
                        f"node {self.name} cannot hold it"
                    )
                )
                continue
            if not self._fits(engine, waiting.request):
                break  # FIFO: later calls do not overtake one that waits for memory
            try:
                admission = engine.try_admit(waiting.request, waiting.arrival_s, verdict is None)
                if admission is None:
                    self._cancel_staging()
                    admission = engine.try_admit(
                        waiting.request, waiting.arrival_s, verdict is None
                    )
            except CallRejected as exc:  # this call only: the engine cannot serve it as asked
                queue.remove(waiting)
                waiting.result.set_exception(exc)
                continue
            if admission is None:
                break
            queue.remove(waiting)
            self.slot.records[-1].admitted += 1
            self.slot.records[-1].sp_admitted += admission.sp_admitted
            # its model has served without a break since its activation's end
            since = self.slot.serving_since.get(model, waiting.arrival_s)
            slot_wait_s = max(0.0, since - waiting.arrival_s)
            task = asyncio.get_running_loop().create_task(
                self._serve(engine, admission, waiting, slot_wait_s)
            )
            waiting.serving = task
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    @staticmethod
    def abandon(serving: asyncio.Task[None]) -> None:
        """The consumer of an admitted call left: cancel its serving task, so the engine
        aborts the generation and frees what it holds (``Engine.run``'s stream is closed).

        The cancellation is sent one callback later, after the task's first step. A task
        cancelled before that step never runs its body: the engine would never see its stream
        closed (the simulated engine generates on to the end with its KV pinned; vLLM's keeps
        counting the call as running, so its model never drains), and the node would not hear
        of its end (nothing wakes the loop then: a call waiting for that memory or that drain
        waited for the next unrelated event, a session's idle end). The task's first step is
        already scheduled when it exists, and the loop runs callbacks in the order they were
        scheduled, so the cancellation always finds the task inside the engine's stream."""
        asyncio.get_running_loop().call_soon(serving.cancel)

    async def _serve(
        self, engine: Engine, admission: Admission, waiting: WaitingCall, slot_wait_s: float
    ) -> None:
        """Run the admitted call; its ``Finished`` result carries ``slot_wait_s`` (CallResult)."""
        try:
            async for event in engine.run(admission):
                if isinstance(event, Finished):
                    event = Finished(replace(event.result, slot_wait_s=slot_wait_s))
                    self._on_finished(waiting.request, event.result)
                if waiting.events is not None:
                    waiting.events.put_nowait(event)
                if isinstance(event, Finished):
                    waiting.result.set_result(event.result)
        except Exception as exc:  # an engine fault fails this call, never the scheduler
            if not waiting.result.done():
                waiting.result.set_exception(exc)
        except asyncio.CancelledError:  # its consumer left (NodeScheduler.stream)
            waiting.result.cancel()
            raise
        finally:
            self._call_done.set()
            self._wake.set()
