"""NodeScheduler: one node's slot scheduler driving its engines (same code live and simulated).

It keeps one FIFO of waiting calls per model, runs the slot policy of ``slots`` and the admission
rules of ``admission``, holds soft reservations, switches models (deactivate the outgoing engine,
activate the incoming one) and stages the next model's weights when ``d2d_staging`` is on.
All time comes from the injected clock; the loop wakes on arrivals, finishes, the slot deadline
and reservation expiries.
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
from talaria.core.types import CallRequest, CallResult, Finished, GenerationEvent, KvSource
from talaria.runtime.engine import Admission, Engine
from talaria.runtime.scheduling.admission import decide_admission, fits_memory
from talaria.runtime.scheduling.flags import SchedulerFlags
from talaria.runtime.scheduling.resources import KvLocation, NodeMemory, PcieLink
from talaria.runtime.scheduling.slots import CloseReason, close_reason, is_contended, next_model


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

    def expected_output_tokens(self, default: int) -> int:
        return round(self.output_tokens / self.calls) if self.calls else default

    def expected_growth_tokens(self, default_output: int) -> int:
        """Tokens the next call is expected to add: mean appended + mean output so far."""
        appended = self.appended_tokens / (self.calls - 1) if self.calls > 1 else 0
        return round(appended) + self.expected_output_tokens(default_output)


@dataclass(frozen=True)
class _SlotView:
    closing: bool
    contended: bool
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


@dataclass(frozen=True)
class SchedulerConfig:
    quantum_s: float = 60.0
    default_output_tokens: int = 256
    """Output estimate for a session's first call (vLLM-style clients rarely cap it lower)."""


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
        self._clock = clock
        self._waiting: dict[str, deque[_Waiting]] = {m: deque() for m in self.order}
        self._sessions: dict[str, _Session] = {}
        self.reservations = ReservationTable()
        self.slots: list[SlotRecord] = []
        self._active: str | None = None
        self._slot_start_s = 0.0
        self._serving_since_s = 0.0
        self._closing = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Task[None]] = set()

    # -- public ----------------------------------------------------------------------------
    @property
    def active_model(self) -> str | None:
        return self._active

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

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
        self._release_reservation(request.session_id, ReleaseReason.RETURNED)
        fut: asyncio.Future[CallResult] = asyncio.get_running_loop().create_future()
        waiting = _Waiting(request, now, fut, events)
        self._waiting[request.model].append(waiting)
        self._wake.set()
        return waiting

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
        models = {
            name: ModelResidency(
                model=name,
                state=(
                    ModelState.ACTIVE
                    if name == self._active
                    else ModelState.STAGED
                    if engine.staging
                    else ModelState.HOST
                ),
                next_slot_in_s=self._next_slot_in_s(name, now, waiting),
                staged_fraction=engine.snapshot().staged_fraction,
                switch_s=engine.switch_in_s(),
                waiting_calls=waiting[name],
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

    def _next_slot_in_s(self, model: str, now: float, waiting: Mapping[str, int]) -> float:
        """0 if active; else the rest of the active slot's quantum, a quantum + switch for each
        model ahead in round-robin order with waiting calls, and this model's own switch."""
        if model == self._active:
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
            if ahead != self._active and waiting.get(ahead, 0) > 0:
                wait += self.config.quantum_s + self.engines[ahead].switch_in_s()
        return wait + self.engines[model].switch_in_s()

    # -- the loop --------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            self._wake.clear()
            self._expire_reservations()
            if self._active is None:
                model = next_model(self.order, None, self.waiting_counts())
                if model is None:
                    await self._clock.wait_event(self._wake, None)
                else:
                    await self._switch(model)
                continue
            self._admit_waiting()
            reason = self._close_reason()
            if reason is not None:
                self._closing = True
                if self.engines[self._active].running:
                    await self._clock.wait_event(self._wake, None)
                    continue
                await self._close_slot(reason)
                continue
            self._stage_next()
            await self._clock.wait_event(self._wake, self._next_timer_s())

    def _deadline_s(self) -> float:
        return self._slot_start_s + self.config.quantum_s

    def _contended(self) -> bool:
        return self._active is not None and is_contended(self._active, self.waiting_counts())

    def _next_timer_s(self) -> float | None:
        timers = [self.reservations.next_expiry_s()]
        if self._contended():
            timers.append(self._deadline_s())
        pending = [t for t in timers if t is not None]
        return max(0.0, min(pending) - self._clock.now()) if pending else None

    def _close_reason(self) -> CloseReason | None:
        assert self._active is not None
        return close_reason(
            now_s=self._clock.now(),
            deadline_s=self._deadline_s(),
            contended=self._contended(),
            running=self.engines[self._active].running,
            admissible_waiting=bool(self._waiting[self._active]) and self._any_admissible(),
            live_reservations=len(self.reservations.for_model(self._active)),
        )

    # -- admission -------------------------------------------------------------------------
    def _slot_view(self) -> _SlotView:
        """What every admission decision of one pass shares (computed once per pass)."""
        return _SlotView(
            closing=self._closing,
            contended=self._contended(),
            remaining_s=self._deadline_s() - self._clock.now(),
        )

    def _decide(self, waiting: _Waiting, view: _SlotView) -> bool | None:
        """True: admit; False: keep waiting; None: admit as SP."""
        assert self._active is not None
        engine = self.engines[self._active]
        request = waiting.request
        # A call queued before its session ended (e.g. by a final call) keeps a fresh record.
        session = self._sessions.setdefault(request.session_id, _Session(request.model))
        default_out = self.config.default_output_tokens
        decision = decide_admission(
            sp_admission=self.flags.sp_admission,
            closing=view.closing,
            in_slot_batch=waiting.arrival_s <= self._slot_start_s,
            contended=view.contended,
            is_continuation=session.calls > 0,
            remaining_s=view.remaining_s,
            estimate_service_s=lambda: engine.estimate_service_s(
                request, session.expected_output_tokens(default_out)
            ),
        )
        if not decision.admit:
            return False
        return None if decision.sp else True

    def _any_admissible(self) -> bool:
        assert self._active is not None
        view = self._slot_view()
        return any(self._decide(w, view) is not False for w in self._waiting[self._active])

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

    def _admit_waiting(self) -> None:
        assert self._active is not None
        engine = self.engines[self._active]
        queue = self._waiting[self._active]
        view = self._slot_view()
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
            admission = engine.try_admit(waiting.request, waiting.arrival_s, verdict is None)
            if admission is None:
                self._cancel_staging()
                admission = engine.try_admit(waiting.request, waiting.arrival_s, verdict is None)
            if admission is None:
                break
            queue.remove(waiting)
            self.slots[-1].admitted += 1
            self.slots[-1].sp_admitted += admission.sp_admitted
            # its model has served without a break since _serving_since_s (its switch's end)
            slot_wait_s = max(0.0, self._serving_since_s - waiting.arrival_s)
            task = asyncio.get_running_loop().create_task(
                self._serve(engine, admission, waiting, slot_wait_s)
            )
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    def _is_hopeless(self, engine: Engine, request: CallRequest) -> bool:
        weights = sum(self.memory.weights.values())
        return engine.needed_bytes(request) > self.memory.hbm_capacity_bytes - weights

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
        gap = session.hint_gap_s if session.hint_gap_s is not None else session.gaps.expected_s()
        session.hint_gap_s = None
        deadline = self._deadline_s() if self._contended() else None
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

    def _expire_reservations(self) -> None:
        for res in self.reservations.expired(self._clock.now()):
            self._release_reservation(res.session_id, ReleaseReason.EXPIRED)

    # -- switching -------------------------------------------------------------------------
    async def _close_slot(self, reason: CloseReason) -> None:
        assert self._active is not None
        record = self.slots[-1]
        record.end_s, record.close = self._clock.now(), reason
        model = next_model(self.order, self._active, self.waiting_counts())
        if model == self._active or model is None:
            self._open_slot(self._active, 0.0)
        else:
            await self._switch(model)

    def _open_slot(self, model: str, switch_s: float) -> None:
        if model != self._active or not self.slots:
            self._serving_since_s = self._clock.now()  # a slot reopened for it does not reset it
        self._active = model
        self._slot_start_s = self._clock.now()
        self._closing = False
        self.slots.append(SlotRecord(model, self._slot_start_s - switch_s, switch_s))

    async def _switch(self, model: str) -> None:
        start = self._clock.now()
        outgoing = self._active
        self._active = None
        if outgoing is not None:
            for res in self.reservations.for_model(outgoing):
                self._release_reservation(res.session_id, ReleaseReason.SLOT_CLOSED)
            await self.engines[outgoing].deactivate(
                keep_kv_on_host=self.flags.host_kv,
                keep_host_weight_copy=self.flags.d2d_staging,
            )
        for name, engine in self.engines.items():
            if name != model:
                engine.cancel_staging()
        await self.engines[model].activate()
        self._open_slot(model, self._clock.now() - start)

    def _stage_next(self) -> None:
        if not self.flags.d2d_staging or self._active is None:
            return
        waiting = {m: n for m, n in self.waiting_counts().items() if m != self._active}
        target = next_model(self.order, self._active, waiting)
        if target is None:
            return
        for name, engine in self.engines.items():
            if name not in (target, self._active):
                engine.cancel_staging()
        self.engines[target].start_staging()

    def _cancel_staging(self) -> None:
        for engine in self.engines.values():
            if not engine.active:
                engine.cancel_staging()
