"""NodeScheduler: one node's slot scheduler driving its engines (same code live and simulated).

It keeps one FIFO of waiting calls per model, runs the slot policy of ``slots`` and the admission
rules of ``admission``, holds soft reservations, switches models (deactivate the outgoing
engines, activate the incoming ones) and stages the next model's weights when ``d2d_staging`` is
on. All time comes from the injected clock; the loop wakes on arrivals, finishes, the slot
deadline and reservation expiries.

The node serves a *resident set* of models: one (the slot's model) without ``co_residency``,
else the slot's model plus every model that fits beside it (``slots.resident_set``). Each pass
computes the *plan*, the next resident set, from the calls waiting for models that are not
resident (none: uncontended, nothing closes):

- resident models in the plan (*staying*) admit as in an uncontended slot;
- resident models not in the plan (*leaving*) follow the contended-slot rules (slot batch, SP
  budget, the slot's deadline) and, once the slot closes (quantum or idle), drain;
- models in the plan that are not resident (*incoming*) are activated once the leaving ones
  have drained (at once when none leaves: they fit beside the residents).

A transition (deactivate, make room, activate) runs as a task of its own, so staying models
keep serving through it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from talaria.core.clock import Clock
from talaria.core.reservations import (
    GapEstimator,
    ReleaseReason,
    ReservationTable,
    plan_reservation,
)
from talaria.core.status import (
    RECENT_SLOTS,
    InstanceStatus,
    ModelResidency,
    ModelState,
    SessionKvStatus,
    SlotView,
)
from talaria.core.types import (
    CallRejected,
    CallRequest,
    CallResult,
    Finished,
    GenerationEvent,
    KvSource,
)
from talaria.runtime.engine import Admission, Engine
from talaria.runtime.scheduling.admission import decide_admission, fits_memory
from talaria.runtime.scheduling.flags import SchedulerFlags
from talaria.runtime.scheduling.resources import KvLocation, NodeMemory, PcieLink
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


async def _next_event(
    events: asyncio.Queue[GenerationEvent], done: asyncio.Future[Any]
) -> GenerationEvent | None:
    """The next queued event, or None once ``done`` resolves with nothing left queued."""
    while True:
        if not events.empty():
            return events.get_nowait()
        if done.done():
            return None
        getter = asyncio.ensure_future(events.get())
        try:
            await asyncio.wait([getter, done], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()


class UnknownModelError(LookupError):
    """The node does not host the requested model."""


class CallTooLargeError(RuntimeError):
    """The call needs more KV memory than the node can ever give it."""


@dataclass(eq=False)
class _Waiting:
    request: CallRequest
    arrival_s: float
    result: asyncio.Future[CallResult]
    events: asyncio.Queue[GenerationEvent] | None = None


@dataclass
class _Session:
    model: str
    calls: int = 0
    last_finish_s: float | None = None
    gaps: GapEstimator = field(default_factory=GapEstimator)
    output_tokens: int = 0
    appended_tokens: int = 0
    context_tokens: int = 0
    hint_gap_s: float | None = None
    pending: int = 0
    """Calls of the session queued or running here."""

    def expected_gap_s(self) -> float:
        return self.hint_gap_s if self.hint_gap_s is not None else self.gaps.expected_s()

    def expected_output_tokens(self, default: int) -> int:
        return round(self.output_tokens / self.calls) if self.calls else default

    def expected_growth_tokens(self, default_output: int) -> int:
        """Tokens the next call is expected to add: mean appended + mean output so far."""
        appended = self.appended_tokens / (self.calls - 1) if self.calls > 1 else 0
        return round(appended) + self.expected_output_tokens(default_output)


@dataclass(frozen=True)
class _SlotView:
    leaving: frozenset[str]
    """Resident models not in the plan: they follow the contended-slot rules."""
    closing: frozenset[str]
    """Models that admit nothing: draining before they leave, or all during a memory hold."""
    remaining_s: float


@dataclass
class SlotRecord:
    model: str
    start_s: float
    switch_s: float
    end_s: float | None = None
    close: CloseReason | None = None
    admitted: int = 0
    sp_admitted: int = 0
    co_resident: tuple[str, ...] = ()
    """The other models resident and serving during this slot (``co_residency``)."""
    activated: tuple[str, ...] = ()
    """Models activated (woken) when this slot opened: its switch."""


@dataclass(frozen=True)
class SchedulerConfig:
    quantum_s: float = 60.0
    default_output_tokens: int = 256
    """Output estimate for a session's first call (vLLM-style clients rarely cap it lower)."""
    stale_after_quanta: float = 10.0
    """A session idle for this many quanta no longer counts as expected back (demand)."""


class NodeScheduler:
    def __init__(
        self,
        name: str,
        engines: Mapping[str, Engine],
        memory: NodeMemory,
        clock: Clock,
        flags: SchedulerFlags,
        config: SchedulerConfig | None = None,
        pcie: PcieLink | None = None,
    ) -> None:
        self.name = name
        self.pcie = pcie  # the engines' shared link, kept for status and statistics
        self.engines = dict(engines)
        self.order = list(engines)
        self.memory = memory
        self.flags = flags
        self.config = config or SchedulerConfig()
        self._demand_policy = DemandPolicy(self.config.quantum_s)
        self._clock = clock
        self._waiting: dict[str, deque[_Waiting]] = {m: deque() for m in self.order}
        self._sessions: dict[str, _Session] = {}
        self.reservations = ReservationTable()
        self.slots: list[SlotRecord] = []
        self._active: str | None = None
        """The slot's model (None before the first slot and while it is switched out)."""
        self._resident: list[str] = []
        """Active engines, admitting calls (the slot's model and its co-residents)."""
        self._leaving: set[str] = set()
        """Resident models draining after their slot closed, admitting nothing."""
        self._hold = False
        """A transition waits for HBM: no model admits until it has room."""
        self._slot_start_s = 0.0
        self._slot_length_s = self.config.quantum_s
        self._serving_since: dict[str, float] = {}
        self._transition: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._call_done = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Task[None]] = set()

    # -- public ----------------------------------------------------------------------------
    @property
    def active_model(self) -> str | None:
        return self._active

    @property
    def resident_models(self) -> list[str]:
        return list(self._resident)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        for task in (self._task, self._transition):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._task = self._transition = None

    async def submit(self, request: CallRequest) -> CallResult:
        """Queue the call and wait for its result."""
        return await self._enqueue(request, None).result

    async def stream(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        """Queue the call and yield its events (``FirstToken``, ``TokenDelta``s for streaming
        requests, ``Finished``). If the consumer stops before the call is admitted, the call
        leaves the queue; once admitted it runs to the end (its result still counts)."""
        events: asyncio.Queue[GenerationEvent] = asyncio.Queue()
        waiting = self._enqueue(request, events)
        try:
            while True:
                event = await _next_event(events, waiting.result)
                if event is None:  # the call ended without a Finished event: it failed
                    error = waiting.result.exception()
                    if error is not None:
                        raise error
                    return
                yield event
                if isinstance(event, Finished):
                    return
        finally:
            queue = self._waiting[request.model]
            if waiting in queue:
                queue.remove(waiting)
                waiting.result.cancel()
                self._wake.set()

    def _enqueue(
        self, request: CallRequest, events: asyncio.Queue[GenerationEvent] | None
    ) -> _Waiting:
        if request.model not in self.engines:
            raise UnknownModelError(f"node {self.name} does not host model {request.model!r}")
        now = self._clock.now()
        session = self._sessions.setdefault(request.session_id, _Session(request.model))
        if session.last_finish_s is not None:
            session.gaps.observe(now - session.last_finish_s)
        if session.context_tokens:
            session.appended_tokens += max(0, request.prompt_tokens - session.context_tokens)
        session.pending += 1
        self._release_reservation(request.session_id, ReleaseReason.RETURNED)
        fut: asyncio.Future[CallResult] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda _: self._settled(request.session_id))
        waiting = _Waiting(request, now, fut, events)
        self._waiting[request.model].append(waiting)
        self._wake.set()
        return waiting

    def _settled(self, session_id: str) -> None:
        session = self._sessions.get(session_id)
        if session is not None and session.pending > 0:
            session.pending -= 1

    def hint(self, session_id: str, expected_gap_s: float) -> None:
        """A tool started: the session expects to be back in ``expected_gap_s``."""
        session = self._sessions.get(session_id)
        if session is not None:
            session.hint_gap_s = expected_gap_s

    def session_moved(self, session_id: str) -> None:
        """The session's next call went elsewhere: release its reservation here (its KV stays,
        evictable, in case it comes back)."""
        self._release_reservation(session_id, ReleaseReason.MOVED)
        self._wake.set()

    def end_session(self, session_id: str) -> None:
        self._release_reservation(session_id, ReleaseReason.ENDED)
        entry = self.memory.kv.get(session_id)
        if entry is not None and not entry.pinned:
            self.memory.drop(session_id)
        self._sessions.pop(session_id, None)
        self._wake.set()

    def waiting_counts(self) -> dict[str, int]:
        return {m: len(q) for m, q in self._waiting.items()}

    def status(self) -> InstanceStatus:
        """The snapshot routing reads (core/status.py)."""
        now = self._clock.now()
        waiting = self.waiting_counts()
        live = self._live_sessions(now)
        models = {
            name: ModelResidency(
                model=name,
                state=(
                    ModelState.ACTIVE
                    if name in self._resident
                    else ModelState.STAGED
                    if engine.staging
                    else ModelState.HOST
                ),
                next_slot_in_s=self._next_slot_in_s(name, now, waiting),
                staged_fraction=engine.snapshot().staged_fraction,
                switch_s=engine.switch_in_s(),
                waiting_calls=waiting[name],
                live_sessions=live.get(name, 0),
            )
            for name, engine in self.engines.items()
        }
        sessions = {}
        for entry in self.memory.kv.values():
            engine = self.engines.get(entry.model)
            if engine is None:
                continue
            in_hbm = entry.location is KvLocation.HBM
            sessions[entry.session_id] = SessionKvStatus(
                location=entry.location.value,
                tokens=entry.tokens,
                model=entry.model,
                restore_s=0.0 if in_hbm else engine.kv_restore_s(entry.tokens),
                recompute_s=engine.recompute_s(entry.tokens),
            )
        for name, engine in self.engines.items():
            # KV a real engine keeps in its own pool, for the sessions still live here
            for session_id, (tokens, source) in engine.session_kv().items():
                if session_id in sessions or session_id not in self._sessions:
                    continue
                in_hbm = source is KvSource.HBM
                location = KvLocation.HBM if in_hbm else KvLocation.HOST
                sessions[session_id] = SessionKvStatus(
                    location=location.value,
                    tokens=tokens,
                    model=name,
                    restore_s=0.0 if in_hbm else engine.kv_restore_s(tokens),
                    recompute_s=engine.recompute_s(tokens),
                )
        kv_room = (
            self.memory.hbm_capacity_bytes
            - sum(self.memory.weights.values())
            - sum(self.memory.staged.values())
        )
        return InstanceStatus(
            instance=self.name,
            at_s=now,
            active_model=self._active,
            models=models,
            sessions=sessions,
            reserved={r.session_id: r.held_bytes for r in self.reservations.live.values()},
            waiting_calls=sum(waiting.values()),
            waiting_prompt_tokens=sum(
                w.request.prompt_tokens for q in self._waiting.values() for w in q
            ),
            running_calls=sum(e.running for e in self.engines.values()),
            kv_utilization=min(1.0, self.memory.hbm_kv_bytes / kv_room) if kv_room > 0 else 1.0,
            recent_slots=[
                SlotView(
                    model=s.model,
                    start_s=s.start_s,
                    switch_s=s.switch_s,
                    end_s=s.end_s,
                    close=None if s.close is None else s.close.value,
                    admitted=s.admitted,
                )
                for s in self.slots[-RECENT_SLOTS:]
            ],
        )

    def _in_gap(self, now: float) -> list[_Session]:
        """Sessions in a tool gap: nothing queued or running here, their last call ended within
        the stale window (``stale_after_quanta`` quanta)."""
        stale = now - self.config.stale_after_quanta * self.config.quantum_s
        return [
            s
            for s in self._sessions.values()
            if not s.pending and s.last_finish_s is not None and s.last_finish_s >= stale
        ]

    def _live_sessions(self, now: float) -> dict[str, int]:
        """Per model: sessions with a call here now, or in a tool gap (``_in_gap``)."""
        live: dict[str, int] = {}
        for session in [s for s in self._sessions.values() if s.pending] + self._in_gap(now):
            live[session.model] = live.get(session.model, 0) + 1
        return live

    def _next_slot_in_s(self, model: str, now: float, waiting: Mapping[str, int]) -> float:
        """0 if resident; else the rest of the slot, a quantum + switch for each model ahead
        in round-robin order with waiting calls, and this model's own switch."""
        if model in self._resident:
            return 0.0
        wait = 0.0
        start = 0
        if self._active is not None:
            wait = max(0.0, self._deadline_s() - now)
            start = self.order.index(self._active) + 1
        for i in range(len(self.order)):
            ahead = self.order[(start + i) % len(self.order)]
            if ahead == model:
                break
            if ahead not in self._resident and waiting.get(ahead, 0) > 0:
                wait += self.config.quantum_s + self.engines[ahead].switch_in_s()
        return wait + self.engines[model].switch_in_s()

    # -- demand and the plan -----------------------------------------------------------------
    def _demands(self, now: float) -> dict[str, Demand]:
        """Per model: queued calls, the age of the oldest, and the sessions in a tool gap
        (nothing queued or running, not stale) expected back within a quantum."""
        horizon = now + self.config.quantum_s
        back = dict.fromkeys(self.order, 0)
        for session in self._in_gap(now):
            assert session.last_finish_s is not None
            if session.last_finish_s + session.expected_gap_s() <= horizon:
                back[session.model] = back.get(session.model, 0) + 1
        return {
            m: Demand(len(q), back.get(m, 0), now - q[0].arrival_s if q else 0.0)
            for m, q in self._waiting.items()
        }

    def _plan(self) -> list[str] | None:
        """The next resident set (the slot's model first), or None when no model outside the
        resident set has a waiting call (uncontended)."""
        waiting = self.waiting_counts()
        outside = {m: n for m, n in waiting.items() if n > 0 and m not in self._resident}
        if not outside:
            return None
        demands: dict[str, Demand] = {}
        if self.flags.demand_slots or self.flags.co_residency:
            demands = self._demands(self._clock.now())
        if self.flags.demand_slots:
            eligible = {m: d for m, d in demands.items() if d.waiting > 0}
            first = next_model_by_demand(self.order, self._active, eligible, self._demand_policy)
        else:
            first = next_model(self.order, self._active, outside)
        assert first is not None
        if not self.flags.co_residency:
            return [first]
        return resident_set(
            first,
            self._resident,
            demands,
            {m: e.weight_bytes for m, e in self.engines.items()},
            {m: e.kv_floor_bytes() for m, e in self.engines.items()},
            self.memory.hbm_capacity_bytes,
            self.config.quantum_s,
        )

    def _leaving_in(self, plan: list[str] | None) -> frozenset[str]:
        if plan is None:
            return frozenset()
        return frozenset(m for m in self._resident if m not in plan)

    # -- the loop --------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            self._wake.clear()
            self._expire_reservations()
            if self._transition is not None:
                self._admit_waiting(self._plan())
                await self._clock.wait_event(self._wake, self._next_timer_s(None))
                continue
            if not self._resident:
                model = next_model(self.order, None, self.waiting_counts())
                if model is None:
                    await self._clock.wait_event(self._wake, None)
                    continue
                self._begin_transition(self._plan() or [model])
                continue
            self._admit_waiting(self._plan())
            plan = self._plan()
            if self._step_slot(plan):
                continue
            self._stage_next(plan)
            await self._clock.wait_event(self._wake, self._next_timer_s(plan))

    def _step_slot(self, plan: list[str] | None) -> bool:
        """Close, renew or change the slot as the plan says; True when a transition began."""
        if plan is None:
            if self._leaving:  # the calls it closed for went away: the slot goes on
                self._leaving.clear()
                self._open_slot(self._resident, 0.0, ())
            return False
        leaving = self._leaving_in(plan)
        incoming = [m for m in plan if m not in self._resident]
        if not leaving:
            self._leaving.clear()
            if incoming:  # they fit beside the residents: no slot needs to close
                self._begin_transition(plan)
                return True
            if self._clock.now() >= self._deadline_s():
                self._renew_slot(plan, CloseReason.QUANTUM)
            return False
        if not self._leaving:
            reason = self._close_reason(leaving)
            if reason is None:
                return False
            self.slots[-1].end_s, self.slots[-1].close = self._clock.now(), reason
        self._leaving = set(leaving)
        if any(self.engines[m].running for m in leaving):
            return False  # the leaving models drain first
        self._begin_transition(plan)
        return True

    def _deadline_s(self) -> float:
        return self._slot_start_s + self._slot_length_s

    def _next_timer_s(self, plan: list[str] | None) -> float | None:
        timers = [self.reservations.next_expiry_s()]
        if plan is not None and self._active is not None and not self._leaving:
            timers.append(self._deadline_s())  # a closed slot waits for its drain instead
        pending = [t for t in timers if t is not None]
        return max(0.0, min(pending) - self._clock.now()) if pending else None

    def _close_reason(self, leaving: frozenset[str]) -> CloseReason | None:
        view = self._slot_view(leaving)
        return close_reason(
            now_s=self._clock.now(),
            deadline_s=self._deadline_s(),
            contended=True,
            running=sum(self.engines[m].running for m in leaving),
            admissible_waiting=any(
                self._decide(w, view) is not False for m in leaving for w in self._waiting[m]
            ),
            live_reservations=sum(len(self.reservations.for_model(m)) for m in leaving),
        )

    # -- admission -------------------------------------------------------------------------
    def _slot_view(self, leaving: frozenset[str]) -> _SlotView:
        """What every admission decision of one pass shares (computed once per pass)."""
        closing = frozenset(self._resident) if self._hold else frozenset(self._leaving)
        return _SlotView(leaving, closing, self._deadline_s() - self._clock.now())

    def _decide(self, waiting: _Waiting, view: _SlotView) -> bool | None:
        """True: admit; False: keep waiting; None: admit as SP."""
        request = waiting.request
        engine = self.engines[request.model]
        # A call queued before its session ended (e.g. by a final call) keeps a fresh record.
        session = self._sessions.setdefault(request.session_id, _Session(request.model))
        default_out = self.config.default_output_tokens
        decision = decide_admission(
            sp_admission=self.flags.sp_admission,
            closing=request.model in view.closing,
            in_slot_batch=waiting.arrival_s <= self._slot_start_s,
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

    def _fits(self, engine: Engine, request: CallRequest) -> bool:
        evictable = sum(
            e.nbytes for e in self.memory.lru(KvLocation.HBM) if e.session_id != request.session_id
        )
        return fits_memory(
            needed_bytes=engine.needed_bytes(request),
            free_bytes=self.memory.hbm_free_bytes() + sum(self.memory.staged.values()),
            evictable_bytes=evictable,
            reserved_bytes=self.reservations.held_bytes(exclude_session=request.session_id),
        )

    def _admit_waiting(self, plan: list[str] | None) -> None:
        if not self._resident or not self.slots:
            return
        view = self._slot_view(self._leaving_in(plan))
        for model in list(self._resident):
            self._admit_model(model, view)

    def _admit_model(self, model: str, view: _SlotView) -> None:
        engine = self.engines[model]
        queue = self._waiting[model]
        for waiting in list(queue):
            verdict = self._decide(waiting, view)
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
            self.slots[-1].admitted += 1
            self.slots[-1].sp_admitted += admission.sp_admitted
            # its model has served without a break since its activation's end
            since = self._serving_since.get(model, waiting.arrival_s)
            slot_wait_s = max(0.0, since - waiting.arrival_s)
            task = asyncio.get_running_loop().create_task(
                self._serve(engine, admission, waiting, slot_wait_s)
            )
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    def _is_hopeless(self, engine: Engine, request: CallRequest) -> bool:
        return engine.needed_bytes(request) > self.memory.hbm_capacity_bytes - engine.weight_bytes

    async def _serve(
        self, engine: Engine, admission: Admission, waiting: _Waiting, slot_wait_s: float
    ) -> None:
        """Run the admitted call; its ``Finished`` result carries ``slot_wait_s`` (CallResult)."""
        try:
            async for event in engine.run(admission):
                if isinstance(event, Finished):
                    event = Finished(replace(event.result, slot_wait_s=slot_wait_s))
                    self._finished(waiting.request, event.result)
                if waiting.events is not None:
                    waiting.events.put_nowait(event)
                if isinstance(event, Finished):
                    waiting.result.set_result(event.result)
        except Exception as exc:  # an engine fault fails this call, never the scheduler
            if not waiting.result.done():
                waiting.result.set_exception(exc)
        finally:
            self._call_done.set()
            self._wake.set()

    def _finished(self, request: CallRequest, result: CallResult) -> None:
        session = self._sessions.get(result.session_id)
        if session is None:
            return
        session.calls += 1
        session.output_tokens += result.output_tokens
        session.context_tokens = result.prompt_tokens + result.output_tokens
        session.last_finish_s = result.finished_s
        if request.session_final:
            self.end_session(request.session_id)
            return
        if request.expected_tool_gap_s is not None:
            session.hint_gap_s = request.expected_tool_gap_s
        if not self.flags.soft_reservations:
            return
        gap = session.expected_gap_s()
        session.hint_gap_s = None
        leaving = self._leaving_in(self._plan())
        deadline = self._deadline_s() if result.model in leaving else None
        entry = self.memory.kv.get(result.session_id)
        if entry is not None and entry.location is not KvLocation.HBM:
            return  # its KV already left HBM: nothing to hold
        held = 0.0  # an engine that manages its own KV (vLLM) leaves no entry to hold
        if entry is not None:
            engine = self.engines[result.model]
            growth = session.expected_growth_tokens(self.config.default_output_tokens)
            held = engine.kv_bytes(entry.tokens + growth) - entry.nbytes
        plan = plan_reservation(
            session_id=result.session_id,
            model=result.model,
            now_s=result.finished_s,
            expected_gap_s=gap,
            held_bytes=held,
            deadline_s=deadline,
        )
        if plan is not None:
            self.reservations.add(plan)
            if entry is not None:
                entry.pins += 1

    def _unpin(self, session_id: str) -> None:
        """Drop the pin a released reservation held on the session's KV."""
        entry = self.memory.kv.get(session_id)
        if entry is not None and entry.pins > 0:
            entry.pins -= 1

    def _release_reservation(self, session_id: str, reason: ReleaseReason) -> None:
        if self.reservations.release(session_id, reason) is not None:
            self._unpin(session_id)

    def _release_model_reservations(self, model: str) -> None:
        for res in self.reservations.for_model(model):
            self._release_reservation(res.session_id, ReleaseReason.SLOT_CLOSED)

    def _expire_reservations(self) -> None:
        for res in self.reservations.expired(self._clock.now()):
            self._release_reservation(res.session_id, ReleaseReason.EXPIRED)

    # -- slots and transitions -----------------------------------------------------------------
    def _renew_slot(self, plan: list[str], reason: CloseReason) -> None:
        """The slot's quantum ran out, but the plan keeps every resident: a new slot, no
        switch."""
        self.slots[-1].end_s, self.slots[-1].close = self._clock.now(), reason
        self._open_slot(plan, 0.0, ())

    def _open_slot(self, plan: list[str], switch_s: float, activated: tuple[str, ...]) -> None:
        """A new slot for ``plan[0]`` (its model) with the current residents beside it."""
        if self.slots and self.slots[-1].end_s is None:
            self.slots[-1].end_s = self._clock.now() - switch_s
        now = self._clock.now()
        self._active = plan[0]
        self._slot_start_s = now
        self._slot_length_s = self.config.quantum_s
        if self.flags.demand_slots:
            self._slot_length_s = slot_length_s(plan[0], self._demands(now), self._demand_policy)
        others = tuple(m for m in self._resident if m != plan[0])
        self.slots.append(
            SlotRecord(plan[0], now - switch_s, switch_s, co_resident=others, activated=activated)
        )

    def _begin_transition(self, plan: list[str]) -> None:
        self._transition = asyncio.get_running_loop().create_task(self._switch(plan))

    async def _switch(self, plan: list[str]) -> None:
        """Deactivate the drained leaving models, make room, activate the incoming ones, and
        open the plan's slot. Staying models keep serving meanwhile."""
        try:
            start = self._clock.now()
            leaving = [m for m in self._resident if m not in plan]
            incoming = [m for m in plan if m not in self._resident]
            self._resident = [m for m in self._resident if m in plan]
            if self._active not in self._resident:
                self._active = None
            for model in leaving:
                self._release_model_reservations(model)
                self._serving_since.pop(model, None)
                await self.engines[model].deactivate(
                    keep_kv_on_host=self.flags.host_kv,
                    keep_host_weight_copy=self.flags.d2d_staging,
                )
            self._leaving.clear()
            for name, engine in self.engines.items():
                if name not in incoming:
                    engine.cancel_staging()
            extend = bool(self.slots) and self._active == plan[0] and not leaving
            for model in incoming:
                await self._make_room(self.engines[model])
                await self.engines[model].activate()
                self._resident.append(model)
                self._resident.sort(key=plan.index)
                self._serving_since[model] = self._clock.now()
                if extend:  # the slot goes on; the model joins it
                    self.slots[-1].activated += (model,)
                    self.slots[-1].co_resident = tuple(self._resident[1:])
                else:  # the slot opens as soon as its first model is in; others join it
                    self._open_slot(plan, self._clock.now() - start, (model,))
                    extend = True
                self._wake.set()
            if not extend:
                self._open_slot(plan, self._clock.now() - start, ())
        finally:
            self._transition = None
            self._hold = False
            self._wake.set()

    async def _make_room(self, engine: Engine) -> None:
        """Wait until the engine's weights fit: release the residents' reservations on the
        way, and hold every admission while running calls still pin the room it needs."""
        while not engine.can_activate():
            for model in self._resident:
                self._release_model_reservations(model)
            if engine.can_activate():
                return
            self._hold = True
            self._call_done.clear()
            await self._clock.wait_event(self._call_done, None)
        self._hold = False

    def _stage_next(self, plan: list[str] | None) -> None:
        if not self.flags.d2d_staging or self._active is None or plan is None:
            return
        incoming = [m for m in plan if m not in self._resident]
        if not incoming:
            return
        target = incoming[0]
        for name, engine in self.engines.items():
            if name != target and not engine.active:
                engine.cancel_staging()
        self.engines[target].start_staging()

    def _cancel_staging(self) -> None:
        for engine in self.engines.values():
            if not engine.active:
                engine.cancel_staging()
