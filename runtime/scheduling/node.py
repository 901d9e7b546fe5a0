"""NodeScheduler: one node's slot scheduler driving its engines (same code live and simulated).

It composes the parts of this package: a call's way in and out (calls.py), the admission pass
over the waiting queues (intake.py), the slot loop and its transitions (loop.py), the holds
(holds.py), the sessions (sessions.py) and their life here (lifecycle.py), and the
status snapshot (node_status.py), over what they all read (state.py's ``NodeContext``). The
slot policy and the admission rules themselves are pure functions (slots.py, admission.py).
All time comes from the injected clock; the loop wakes on arrivals, finishes, the slot
deadline and hold expiries.

Each piece of node state has one owner, its only writer; the others read it through the
owner's methods or a read-only view (state.py says how each change is asked for):

| part                 | owns (its only writer)                  | the others read it through     |
|----------------------|-----------------------------------------|--------------------------------|
| ``NodeScheduler``    | the model set                           | ``NodeContext``                |
| ``SessionLifecycle`` | the sessions                            | ``SessionsView``               |
| ``Intake``           | the waiting queues; the serving         | ``Intake.waiting`` (read-only) |
| ``SlotLoop``         | the slot, transitions, holds            | ``.slot``, ``.holds``          |
| ``NodeCalls``        | nothing: it asks the intake, lifecycle  | —                              |
| ``StatusReader``     | nothing: it reads the others            | —                              |
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from types import MappingProxyType

from talaria.core.clock import Clock
from talaria.core.gap_model import GapQuality
from talaria.core.holds import HoldTable, ReleaseReason
from talaria.core.status import InstanceStatus
from talaria.core.types import CallRequest, CallResult, GenerationEvent
from talaria.runtime.engine import ClassStepRule, Engine, StepsByClass
from talaria.runtime.memory.resources import DeviceShare, NodeMemory, PcieLink
from talaria.runtime.scheduling.calls import NodeCalls, NodeStopped, UnknownModelError
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.driven import DrivenEngines
from talaria.runtime.scheduling.events import EventFanout
from talaria.runtime.scheduling.fairness import ServiceAccounts
from talaria.runtime.scheduling.flags import SchedulerFlags
from talaria.runtime.scheduling.holds import KvHolds
from talaria.runtime.scheduling.intake import Intake
from talaria.runtime.scheduling.lifecycle import SessionLifecycle
from talaria.runtime.scheduling.loop import SlotLoop
from talaria.runtime.scheduling.node_status import StatusReader
from talaria.runtime.scheduling.policies.compose import NodePolicies, PolicyChoice
from talaria.runtime.scheduling.sessions import NodeSessions
from talaria.runtime.scheduling.state import NodeContext, Signals, SlotRecord

log = logging.getLogger("talaria.runtime")


class NodeScheduler:
    """One node's scheduler: a FIFO of waiting calls per model, served in slots.

    Slots (the node's slot planner, policies/planner.py): the node serves a resident set: the
    slot's model, plus under a co-resident planner the models that fit beside it (Σ weights +
    the largest full-context KV floor ≤ HBM). The next slot goes to the first model after the
    slot's in round-robin order with a call waiting outside the resident set, or under the
    demand planner to the highest score = (waiting + expected_back) × (1 + oldest_wait / Q), a
    starving model (oldest wait ≥ S = 2Q) first. A slot has a deadline only while contended (a
    non-resident model has a waiting call): start + Q, or start + Q × clamp(n × share, ½, 2)
    under the demand planner. It closes then, or earlier when idle (nothing running, nothing
    it may admit, no live hold); its running calls drain (never preempted) before the
    switch.

    Admission: a call waiting when its slot opened is admitted; a later one at once if its
    model's slot is uncontended; in a contended slot it waits for the next slot, unless the
    admission rule admits session-prefill (policies/switching.py), it is a continuation (its
    session has run here) and its budget fits: estimated service (prefill or KV restore +
    expected output × decode step) ≤ time to the deadline. Every admission needs HBM: needed
    ≤ free + staged + evictable idle KV − other sessions' held bytes.
    """

    def __init__(
        self,
        name: str,
        engines: Mapping[str, Engine],
        memory: NodeMemory,
        clock: Clock,
        policy: PolicyChoice | SchedulerFlags,
        config: SchedulerConfig | None = None,
        pcie: PcieLink | None = None,
        device: DeviceShare | None = None,
    ) -> None:
        """``policy``: the node's choice of policies, or a named policy's flags (flags.py),
        composed once here (policies/compose.py)."""
        self.name = name
        self.pcie = pcie  # the engines' shared link, kept for the replay's statistics
        self.device = device
        """The engines' shared GPUs, kept for an engine added later (``add_model``)."""
        self.memory = memory
        self.policy = policy if isinstance(policy, PolicyChoice) else PolicyChoice.of(policy)
        """The node's choice of policies (engines added later are built for it)."""
        self.config = config or SchedulerConfig()
        self._clock = clock
        self._engines = dict(engines)  # the model set: changed in add_model and retire only
        self._step_rule = (
            ClassStepRule(self.config.class_slowdown, self.config.preempt_limit)
            if self.policy.evicts_by_class and self.config.preempt_limit > 0
            else None
        )
        """Rule 5 of the fair queue for the engines that apply it (``StepsByClass``)."""
        for engine in self._engines.values():
            self._rule_steps(engine)
        accounts = ServiceAccounts()
        self.policies = NodePolicies.build(self.policy, accounts, self.config)
        self._events = EventFanout((accounts, *self.policies.listeners()))
        """Every listener of the node's session events: what it keeps per session goes with
        the session (``SessionLifecycle.forget``)."""
        self._sessions = NodeSessions(self.policies.holds.population, self.config.gap_quantile)
        self._context = NodeContext(
            name=name,
            clock=clock,
            config=self.config,
            memory=memory,
            engines=DrivenEngines(self._engines),
            signals=Signals(clock),
        )
        self._signals = self._context.signals
        # the intake's session callbacks go to the lifecycle, built after the loop it asks
        self._intake = Intake(
            self._context,
            lambda request: self._lifecycle.session_of(request),
            lambda request, result: self._lifecycle.finished(request, result),
            self._sessions, self.policies, accounts, self._events,
        )  # fmt: skip
        holds = KvHolds(memory, clock, self._sessions, self.config)
        self._loop = SlotLoop(self._context, self._intake, self._sessions, holds, self.policies)
        self._lifecycle = SessionLifecycle(
            self._context, self._sessions, self._loop, self.policies, accounts, self._events
        )
        self._calls = NodeCalls(self._context, self._intake, self._lifecycle, lambda: self._failure)
        self._status = StatusReader(self._context, self._intake, self._loop, self._sessions)
        self._task: asyncio.Task[None] | None = None
        self._failure: str | None = None
        self._stopping = False

    # -- public ----------------------------------------------------------------------------
    @property
    def engines(self) -> Mapping[str, Engine]:
        """The hosted models' engines in configured order (read-only: ``add_model`` and
        ``retire`` change the set)."""
        return MappingProxyType(self._engines)

    @property
    def holds(self) -> HoldTable:
        """The node's holds (read-only here; the slot loop keeps them)."""
        return self._loop.holds

    @property
    def gap_quality(self) -> Mapping[str, GapQuality]:
        """Per gap model the node keeps: how well it predicted its sessions' gaps."""
        return MappingProxyType(self._sessions.quality)

    @property
    def slots(self) -> Sequence[SlotRecord]:
        """Every slot so far, oldest first (read-only)."""
        return self._loop.slot.records

    @property
    def clock(self) -> Clock:
        """The node's clock (engines added later share it)."""
        return self._clock

    @property
    def active_model(self) -> str | None:
        """The slot's model (None before the first slot and while it is switched out)."""
        return self._loop.slot.active

    @property
    def resident_models(self) -> list[str]:
        """The models resident and admitting calls: the slot's model and its co-residents."""
        return list(self._loop.slot.resident)

    @property
    def failure(self) -> str | None:
        """Why the scheduling loop ended while the node ran (None while it runs, and after
        ``stop``): the node then serves nothing (its health checks say so,
        runtime/status_routes.py)."""
        return self._failure

    def start(self) -> None:
        """Start the scheduling loop on the running event loop (once)."""
        if self._task is None:
            self._stopping = False
            self._task = asyncio.get_running_loop().create_task(self._loop.run())
            self._task.add_done_callback(self._loop_ended)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """The loop task ended without ``stop``: log why, once; fail every waiting call (and
        every later one) with ``NodeStopped`` rather than leave it waiting for a loop that
        will never admit it. Calls already running finish on their own tasks."""
        if self._stopping:
            return
        error = None if task.cancelled() else task.exception()
        reason = "cancelled" if task.cancelled() else "returned" if error is None else repr(error)
        self._failure = f"node {self.name}: its scheduling loop ended ({reason})"
        log.error("%s; the node serves no call until it restarts", self._failure, exc_info=error)
        self._intake.fail_waiting(NodeStopped(self._failure))
        self._signals.call_ended()  # a retire waiting for the queues looks again

    async def stop(self) -> None:
        """Cancel the loop and any transition under way (running calls are left to finish)."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._loop.cancel_transition()
        self._task = None

    async def submit(self, request: CallRequest) -> CallResult:
        """Queue the call and wait for its result (``NodeCalls.submit``)."""
        return await self._calls.submit(request)

    def stream(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        """Queue the call and yield its events; a consumer that stops early takes the call
        out of the queue or cancels its generation (``NodeCalls.stream``)."""
        return self._calls.stream(request)

    def add_model(self, model: str, engine: Engine, host_weight_bytes: float = 0.0) -> None:
        """Host ``model`` from now on (placement): it joins the round-robin order last, its
        pinned host weight copy (``host_weight_bytes``) leaves the host KV tier."""
        if model in self.engines:
            raise ValueError(f"node {self.name} already hosts {model!r}")
        self.memory.resize_host_kv(-host_weight_bytes)
        self._rule_steps(engine)
        self._engines[model] = engine
        self._intake.open_queue(model)
        self._signals.poke()

    def _rule_steps(self, engine: Engine) -> None:
        """Give ``engine`` the node's rule 5, if it applies one (``StepsByClass``)."""
        if isinstance(engine, StepsByClass):
            engine.step_by_class(self._step_rule)

    async def retire(self, model: str, host_weight_bytes: float = 0.0) -> None:
        """Stop hosting ``model`` (placement): wait until no call of it waits or runs and no
        transition is under way, put it to sleep if resident (its weights released, its
        sessions' KV dropped), and give its pinned host copy back to the host KV tier (none
        for a model whose weights were only on NVMe). The caller has stopped sending it
        calls."""
        if model not in self._engines:
            raise UnknownModelError(f"node {self.name} does not host model {model!r}")
        await self._loop.retire(model)
        for key in [k for k, e in self.memory.kv.items() if e.model == model]:
            self._loop.release_hold(key, ReleaseReason.MOVED)
            self.memory.drop(key)
        self._lifecycle.forget_model(model)
        del self._engines[model]
        self._intake.close_queue(model)
        on_nvme = not self.memory.host_weights.has_copy(model)
        held = self.memory.host_weights.forget(model)
        self.memory.resize_host_kv(0.0 if on_nvme else held or host_weight_bytes)
        self._signals.poke()

    def hint(self, session_key: str, expected_gap_s: float) -> None:
        """A tool started: the session expects to be back in ``expected_gap_s`` (at most
        ``max_hint_gap_s``; ``SessionLifecycle.hint``)."""
        self._lifecycle.hint(session_key, expected_gap_s)

    def session_moved(self, session_key: str) -> None:
        """The session's next call went elsewhere: release its hold here (its KV stays,
        evictable; ``SessionLifecycle.moved``)."""
        self._lifecycle.moved(session_key)

    def end_session(self, session_key: str) -> None:
        """The session ended: release its hold and forget it, at once or when its last
        call here settles (``SessionLifecycle.end``)."""
        self._lifecycle.end(session_key)

    def session_keys(self) -> set[str]:
        """Every session key the node keeps something of (``SessionLifecycle.keys``: for tests
        and diagnostics, not the call path)."""
        return self._lifecycle.keys()

    def waiting_counts(self) -> dict[str, int]:
        """Per model: calls queued."""
        return self._intake.waiting_counts()

    def status(self) -> InstanceStatus:
        """The snapshot routing reads (core/status.py)."""
        self._lifecycle.forget_idle(self._clock.now())
        return self._status.status()
