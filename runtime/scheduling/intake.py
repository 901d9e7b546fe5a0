"""The waiting queues, admission of waiting calls into the resident engines, and serving the
admitted ones.

``Intake`` owns the queues (one FIFO per hosted model): calls join them through ``enqueue``,
leave them through ``withdraw`` or the admission pass, and the other parts read them through
``Intake.waiting`` (read-only). It reads the slot and its holds only through the
``AdmissionView`` the slot loop hands each pass, and returns what it admitted for the loop to
record in the slot.

One pass per scheduler wake-up: for each resident model, its waiting calls in the node's
queue order (policies/queue.py: arrival, or fair: class, tenant shares, least attained service;
the node's events charge each call's estimate to the service accounts when it is admitted and
its measured service when it ends). Each call gets the verdict of the node's admission rule
(policies/switching.py over ``admission.decide_admission``: slot batch, uncontended, SP
budget, or wait); an admissible call
must then fit in memory (``admission.fits_memory``: needed ≤ free HBM + staged weights + evictable
idle KV − other sessions' held bytes; if it does not, other tenants' holds past
their share or stale are released for it, holds.py) and be taken by its engine
(``Engine.try_admit``, which commits its memory and evicts). A call that waits for memory stops
its model's pass: later calls (in that order) never overtake it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from types import MappingProxyType

from talaria.core.types import CallRejected, CallRequest, CallResult, Finished
from talaria.runtime.engine import Admission
from talaria.runtime.memory.resources import KvLocation
from talaria.runtime.scheduling.admission import fits_memory
from talaria.runtime.scheduling.driven import DrivenEngine
from talaria.runtime.scheduling.events import SessionEvents
from talaria.runtime.scheduling.fairness import ServiceAccounts, effective_rank
from talaria.runtime.scheduling.policies.compose import NodePolicies
from talaria.runtime.scheduling.sessions import NodeSession, SessionsView
from talaria.runtime.scheduling.state import NodeContext, WaitingCall


class CallTooLargeError(RuntimeError):
    """The call needs more KV memory than the node can ever give it."""


@dataclass(frozen=True)
class AdmissionView:
    """What every admission decision of one pass reads of the slot and its holds (the
    slot loop, their owner, builds it once per pass)."""

    leaving: frozenset[str]
    """Resident models not in the plan: they follow the contended-slot rules."""
    closing: frozenset[str]
    """Models that admit nothing: draining before they leave, or all during a memory hold."""
    remaining_s: float
    """Time left before the slot's deadline (the SP time budget)."""
    slot_start_s: float
    """When the slot opened: a call waiting since then belongs to its batch."""
    serving_since: Mapping[str, float]
    """Per resident model: when its activation ended (``SlotState.serving_since``)."""
    held_bytes: Callable[[str, Callable[[str], bool] | None], float]
    """Bytes held by the holds of sessions other than the given one (those a
    predicate of their session key accepts, if one is given), at the pass's time: a learned
    hold past keeping its slot holds none (core/holds.py)."""
    make_room: Callable[[CallRequest, Callable[[], bool]], bool] = lambda _call, fits: False
    """A call that does not fit: release the other tenants' holds that yield to it, until the
    predicate says it fits; whether it does (holds.py ``KvHolds.make_room``)."""


class Intake:
    """The waiting queues (their owner: calls join them with ``enqueue``, leave them with
    ``withdraw`` or the admission pass), the admission pass, and the tasks serving the
    admitted calls."""

    def __init__(
        self,
        context: NodeContext,
        session_of: Callable[[CallRequest], NodeSession],
        on_finished: Callable[[CallRequest, CallResult], None],
        sessions: SessionsView,
        policies: NodePolicies,
        accounts: ServiceAccounts,
        events: SessionEvents,
    ) -> None:
        self.context = context
        self.policies = policies
        self._events = events
        self._session_of = session_of
        self._sessions = sessions
        self._on_finished = on_finished
        self._waiting: dict[str, deque[WaitingCall]] = {m: deque() for m in context.engines}
        self.waiting: Mapping[str, Sequence[WaitingCall]] = MappingProxyType(self._waiting)
        """One FIFO of waiting calls per hosted model, read-only."""
        self._calls: set[asyncio.Task[None]] = set()
        self.accounts = accounts
        """What each tenant and session has been served here (kept under every policy, through
        the node's events; read by the fair order and by the status)."""
        self._running: dict[str, dict[WaitingCall, int]] = {m: {} for m in context.engines}
        """Per model: its admitted calls not yet ended, with each one's own class."""

    # -- the queues ------------------------------------------------------------------------
    def waiting_counts(self) -> dict[str, int]:
        """Per model: calls queued."""
        return {m: len(q) for m, q in self._waiting.items()}

    def best_waiting_class(self) -> dict[str, int]:
        """Per model with calls waiting: the best own class among them (the slot policy's
        class order; a promoted call's model comes through the demand policy's own
        starvation bound). Empty while one class only has called here."""
        if self._sessions.classes_seen() < 2:
            return {}
        return {m: min(w.request.priority.rank for w in q) for m, q in self._waiting.items() if q}

    def tenant_queues(self, now_s: float) -> dict[str, tuple[int, float]]:
        """Per tenant with calls waiting: how many, and how long the oldest has waited."""
        out: dict[str, tuple[int, float]] = {}
        for queue in self._waiting.values():
            for w in queue:
                count, oldest = out.get(w.request.tenant, (0, 0.0))
                out[w.request.tenant] = (count + 1, max(oldest, now_s - w.arrival_s))
        return out

    def running_classes(self, model: str) -> list[int]:
        """The own classes of the model's running calls."""
        return list(self._running.get(model, {}).values())

    def open_queue(self, model: str) -> None:
        """A model joined the node (``NodeScheduler.add_model``): its queue, empty."""
        self._waiting[model] = deque()
        self._running[model] = {}

    def close_queue(self, model: str) -> None:
        """A model left the node (``NodeScheduler.retire``, its queue empty)."""
        del self._waiting[model]
        del self._running[model]

    def enqueue(self, waiting: WaitingCall) -> None:
        """The call joins its model's queue, last."""
        self._waiting[waiting.request.model].append(waiting)

    def withdraw(self, waiting: WaitingCall) -> bool:
        """Take the call out of its queue; False if it is not there (admitted, or failed)."""
        queue = self._waiting[waiting.request.model]
        if waiting not in queue:
            return False
        queue.remove(waiting)
        return True

    def fail_waiting(self, error: Exception) -> None:
        """Fail every waiting call with ``error``: the node's loop ended, none will be admitted."""
        for queue in self._waiting.values():
            while queue:
                waiting = queue.popleft()
                if not waiting.result.done():
                    waiting.result.set_exception(error)

    # -- the admission pass ----------------------------------------------------------------
    def decide(self, waiting: WaitingCall, view: AdmissionView) -> bool | None:
        """True: admit; False: keep waiting; None: admit as SP."""
        request = waiting.request
        engine = self.context.engines[request.model]
        session = self._session_of(request)
        default_out = self.context.config.default_output_tokens
        decision = self.policies.admission.decide(
            closing=request.model in view.closing,
            in_slot_batch=waiting.arrival_s <= view.slot_start_s,
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

    def admit_waiting(self, models: Sequence[str], view: AdmissionView) -> tuple[int, int]:
        """One admission pass over the queues of ``models`` (the resident set); the calls
        admitted, and how many of them by the SP budget."""
        admitted = sp_admitted = 0
        for model in models:
            n, sp = self._admit_model(model, view)
            admitted, sp_admitted = admitted + n, sp_admitted + sp
        self.accounts.settle({w.request.tenant for q in self._waiting.values() for w in q})
        return admitted, sp_admitted

    def _fits(
        self, engine: DrivenEngine, request: CallRequest, view: AdmissionView, rank: int
    ) -> bool:
        """The call fits in memory (``admission.fits_memory``), counting the holds
        the queue order counts against a call of class ``rank`` (the call's class now; the fair
        order: a batch session's hold never blocks an interactive call)."""
        memory = self.context.memory
        holds = self.policies.queue.counted_holds(rank, self._sessions)
        needed = engine.needed_bytes(request)
        free = memory.hbm_free_bytes() + sum(memory.staged.values())
        held = view.held_bytes(request.session_key, holds)
        short = needed - free + held  # the idle KV it needs: a walk of that much only
        victims = memory.take_evictable(KvLocation.HBM, short, (request.session_key,))
        return fits_memory(
            needed_bytes=needed,
            free_bytes=free,
            evictable_bytes=sum(e.nbytes for e in victims),
            held_bytes=held,
        )

    def _is_hopeless(self, engine: DrivenEngine, request: CallRequest) -> bool:
        """The call needs more KV than the HBM left beside its model's weights."""
        capacity = self.context.memory.hbm_capacity_bytes
        return engine.needed_bytes(request) > capacity - engine.weight_bytes

    def _cancel_staging(self) -> None:
        """Admission needs the room: cancel every inactive engine's staging."""
        for engine in self.context.engines.values():
            if not engine.active:
                engine.cancel_staging()

    def _admit_model(self, model: str, view: AdmissionView) -> tuple[int, int]:
        engine = self.context.engines[model]
        queue = self._waiting[model]
        admitted = sp_admitted = 0
        for waiting in self.policies.queue.order(queue, self.context.clock.now()):
            verdict = self.decide(waiting, view)
            if verdict is False:
                continue
            if self._is_hopeless(engine, waiting.request):
                queue.remove(waiting)
                waiting.result.set_exception(
                    CallTooLargeError(
                        f"call needs {engine.needed_bytes(waiting.request):.3g} B of KV; "
                        f"node {self.context.name} cannot hold it"
                    )
                )
                continue
            rank = self._rank(waiting)
            if not self._beside_higher_classes(engine, waiting, rank):
                continue  # a lower class than what runs: it waits for that to finish
            fits = self._fits(engine, waiting.request, view, rank)
            if not fits:  # other tenants' holds past their share or stale yield (holds.py)
                again = partial(self._fits, engine, waiting.request, view, rank)
                fits = view.make_room(waiting.request, again)
            if not fits:
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
            admitted += 1
            sp_admitted += admission.sp_admitted
            waiting.estimate_s = self._estimate_s(engine, waiting.request)
            self._events.call_admitted(waiting.request, waiting.estimate_s)
            self._running[model][waiting] = waiting.request.priority.rank
            # its model has served without a break since its activation's end
            since = view.serving_since.get(model, waiting.arrival_s)
            slot_wait_s = max(0.0, since - waiting.arrival_s)
            task = asyncio.get_running_loop().create_task(
                self._serve(engine, admission, waiting, slot_wait_s)
            )
            waiting.serving = task
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
        return admitted, sp_admitted

    def _rank(self, waiting: WaitingCall) -> int:
        """The class the call is served in now (fairness.py rule 1)."""
        config = self.context.config
        waited = self.context.clock.now() - waiting.arrival_s
        starvation_s = config.starvation_quanta * config.quantum_s
        return effective_rank(waiting.request, waited, starvation_s)

    def _beside_higher_classes(self, engine: DrivenEngine, waiting: WaitingCall, rank: int) -> bool:
        """Whether the queue order lets the call join its model's running batch (the fair
        order's rule 4: not slowing the higher classes' calls past ``class_slowdown``)."""
        model = waiting.request.model

        def expected_back() -> list[int]:
            """The context tokens of the model's higher-class sessions in a tool gap that are
            expected back while the call would run."""
            now = self.context.clock.now()
            horizon = now + self._estimate_s(engine, waiting.request)
            return [
                session.context_tokens
                for session in self._sessions.in_gap(now, self.context.stale_window_s())
                if session.model == model
                and session.rank < rank
                and (session.last_finish_s or 0.0) + session.expected_gap_s() <= horizon
            ]

        return self.policies.queue.may_join(
            engine, waiting, rank, self._running[model], self._sessions, expected_back
        )

    def _estimate_s(self, engine: DrivenEngine, request: CallRequest) -> float:
        """The call's service as the engine estimates it (its prefill, its expected decode)."""
        session = self._session_of(request)
        expected = session.expected_output_tokens(self.context.config.default_output_tokens)
        return engine.estimate_service_s(request, expected)

    def _served(self, waiting: WaitingCall, result: CallResult | None) -> None:
        """An admitted call ended: its measured service goes to the accounts (a call that
        failed or was abandoned is charged its estimate)."""
        self._running.get(waiting.request.model, {}).pop(waiting, None)
        measured = waiting.estimate_s
        if result is not None:
            measured = max(0.0, result.finished_s - result.admitted_s)
        self._events.call_ended(waiting.request, waiting.estimate_s, measured)

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
        self, engine: DrivenEngine, admission: Admission, waiting: WaitingCall, slot_wait_s: float
    ) -> None:
        """Run the admitted call; its ``Finished`` result carries ``slot_wait_s`` (CallResult)."""
        served = False
        try:
            async for event in engine.run(admission):
                if isinstance(event, Finished):
                    event = Finished(replace(event.result, slot_wait_s=slot_wait_s))
                    served = True
                    self._served(waiting, event.result)
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
            if not served:  # failed or abandoned: the accounts forget it as running
                self._served(waiting, None)
            self.context.signals.call_ended()
