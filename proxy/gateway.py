"""The gateway service: one LLM call from a normalized, identified request to a recorded result.

Per call: find its session (``sessions.book``: by the client's id, or by the conversation it
continues); route it (``proxy.routing``) over the status of the instances hosting its model,
and release the session's soft reservation (a hit if it came back to the reserved instance);
run it on that instance in a task of its own, so a client that disconnects never loses the call
or its records; then remember the reply as the session's conversation, and take a new soft
reservation when the reply is a tool call (or the client hinted a gap); hand session, call,
decision and reservation records to the batched writer. Sessions idle for
``session_idle_timeout_s`` end. Soft reservations and tool-gap learning follow
``core.reservations.SessionReservations`` (``self.reservations``, the same rules as the
simulator's cluster replay); the gateway keeps their records and metrics.

Time: the gateway schedules on its ``Clock`` (clock seconds: wall seconds × ``time_scale``
under a scaled clock). Everything it shows — records, metrics, ``/v1/models`` — is in wall
seconds, and clients' hints are wall seconds: it converts at that boundary (``_wall_s``,
``_clock_s``).

The gateway passes on what the engine produced (``OutputDelta``s, then a ``ModelOutput``) and
never writes output of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol, overload

from talaria.core.calls import Call, ModelOutput
from talaria.core.clock import Clock
from talaria.core.reservations import SessionReservations, Settled, SoftReservation
from talaria.core.status import InstanceStatus
from talaria.core.types import (
    CallRejected,
    CallRequest,
    CallResult,
    Finished,
    FirstToken,
    TokenDelta,
)
from talaria.proxy.errors import (
    ApiError,
    bad_request,
    too_many_requests,
    too_many_sessions,
    unavailable,
)
from talaria.proxy.metrics import ProxyMetrics
from talaria.proxy.records import (
    CallRecord,
    DecisionRecord,
    HintRecord,
    Record,
    ReservationRecord,
    SessionRecord,
)
from talaria.proxy.routing import NoInstanceError, RouteRequest, RoutingConfig, route
from talaria.proxy.runtime_client import RuntimeClient
from talaria.proxy.schema_check import SchemaCheck
from talaria.proxy.sessions.book import (
    DEFAULT_MAX_PER_TENANT,
    SessionBook,
    SessionLimit,
    SessionState,
)
from talaria.proxy.sessions.conversation import (
    EMPTY,
    Conversation,
    fingerprint,
    tools_fingerprint,
)
from talaria.proxy.sessions.identity import Identity

SWEEP_S = 1.0
"""How often expired reservations and idle sessions are looked for (clock seconds)."""
STORE_RETRY_S = 2.0
"""Retry-After of a call refused because the store cannot take its records: its write queue
is full, or (with durable acknowledgement) its writes are failing."""
SHUTDOWN = "The server is shutting down; retry the call."
NOT_COMMITTED = (
    "The call ran, but the session store has not committed its records in time (they are "
    "kept, and written when the store recovers); retry the call."
)
SHUTDOWN_BEFORE_COMMIT = (
    "The server is shutting down before this call's records were committed; retry the call."
)
DEFAULT_IDLE_TIMEOUT_S = 600.0
"""A session with no call for this long ends (wall seconds). Agents' tool gaps are seconds
to minutes (docs/sources.md §2: p99 3.6 min); TraceLab's human waits between requests have a median
of 1.4 min, so an interactive session that pauses for longer starts a new session."""
log = logging.getLogger("talaria.proxy.gateway")

Api = Literal["chat", "completions", "messages", "responses"]


def tenant_salt(tenant_id: str) -> str:
    """The tenant's prefix-cache salt: a digest, so the runtime never learns tenant ids."""
    return hashlib.blake2b(tenant_id.encode(), digest_size=12).hexdigest()


class RecordSink(Protocol):
    """Where records go (``BatchWriter``)."""

    def submit(self, record: Record) -> int:
        """Queue a record; returns its sequence number."""
        ...

    async def committed(self, seq: int) -> None:
        """Return once record ``seq`` and all before it are committed."""
        ...

    @property
    def full(self) -> bool:
        """Whether the queue is at its bound (new calls are refused)."""
        ...

    @property
    def failing_since(self) -> float | None:
        """Since when writes fail (None: they succeed)."""
        ...


@dataclass(frozen=True)
class AdoptableSession:
    """An open session as the store shows it, for a replica that takes it over."""

    key: str
    model: str
    started_at: datetime
    calls: int
    last_instance: str | None


@dataclass(frozen=True)
class PreparedCall:
    """What the API layer extracted from a request: the normalized call, who sent it, and
    through which dialect."""

    request_id: str
    tenant_id: str
    identity: Identity
    api: Api
    call: Call
    max_tokens: int
    """The output limit: the call's own, or the server's default."""
    extra_records: Callable[[CallOutcome], Sequence[Record]] | None = None
    """Records the API adds to the call's own when it succeeds (the Responses API's stored
    response), committed with them."""
    route_key: str | None = None
    """The session's key among proxy replicas (proxy/cluster/owner.py), when there are any."""

    @property
    def model(self) -> str:
        return self.call.model

    @property
    def stream(self) -> bool:
        return self.call.stream


@dataclass(frozen=True)
class CallOutcome:
    result: CallResult
    instance: str
    output: ModelOutput


EventKind = Literal["first", "delta", "done", "error"]


@dataclass
class CallHandle:
    """A running call: ``events`` receives ("first", OutputDelta | None), ("delta",
    OutputDelta | None), ("done", CallOutcome) or ("error", ApiError); ``task`` runs to the
    end regardless of who reads."""

    events: asyncio.Queue[tuple[EventKind, Any]]
    task: asyncio.Task[CallOutcome | None]
    instance: str
    session_id: str
    """The client's id of the session (its key for an implicit session)."""
    session_key: str
    how: str
    """How the session was found: new, continued, retry or child."""

    async def outcome(self) -> CallOutcome:
        while True:
            kind, value = await self.events.get()
            if kind == "done":
                assert isinstance(value, CallOutcome)
                return value
            if kind == "error":
                raise value


def _call_record(
    call: PreparedCall,
    state: SessionState,
    request: CallRequest,
    runtime: RuntimeClient,
    arrived_at: datetime,
    finished_at: datetime,
    **outcome: Any,
) -> CallRecord:
    """The call's record: who and when, plus ``outcome`` (status, tokens, timings or error)."""
    return CallRecord(
        request_id=call.request_id,
        session_id=state.key,
        call_index=request.call_index,
        model=call.model,
        instance=runtime.name,
        arrived_at=arrived_at,
        finished_at=finished_at,
        stream=call.stream,
        api=call.api,
        **outcome,
    )


def _engine_parts(result: CallResult, wall: Callable[[float], float]) -> dict[str, float]:
    """The call's engine-timed parts in wall seconds (``CallRecord.engine_*``), none where the
    engine reported no timestamps of its own (``EngineTimes``)."""
    t = result.engine
    if t is None:
        return {}
    return {
        "engine_intake_s": wall(t.queued_s - result.admitted_s),
        "engine_queue_s": wall(t.scheduled_s - t.queued_s),
        "engine_prefill_s": wall(t.first_token_s - t.scheduled_s),
        "engine_decode_s": wall(t.last_token_s - t.first_token_s),
    }


class Gateway:
    def __init__(
        self,
        runtimes: Sequence[RuntimeClient],
        sink: RecordSink,
        metrics: ProxyMetrics,
        clock: Clock,
        *,
        router: str = "talaria",
        routing: RoutingConfig | None = None,
        routing_seed: int = 0,
        context_windows: dict[str, int] | None = None,
        max_inflight_per_tenant: int = 512,
        max_sessions_per_tenant: int = DEFAULT_MAX_PER_TENANT,
        session_idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        durable: bool = True,
        commit_timeout_s: float = 30.0,
        time_scale: float = 1.0,
    ) -> None:
        self.runtimes = list(runtimes)
        self._by_name = {r.name: r for r in self.runtimes}
        self._sink = sink
        self.metrics = metrics
        self._clock = clock
        self._router = router
        self._routing = routing or RoutingConfig()
        self._rng = random.Random(routing_seed)
        self._windows = context_windows or {}
        self._max_inflight = max_inflight_per_tenant
        self._time_scale = time_scale
        self._idle_timeout_s = session_idle_timeout_s * time_scale  # clock seconds
        self._durable = durable
        self._commit_timeout_s = commit_timeout_s
        self._last_seq = 0
        self._closing = False
        self._drained: frozenset[str] = frozenset()
        self._owned: Callable[[str], bool] | None = None
        self._adopt: Callable[[str, str], Awaitable[AdoptableSession | None]] | None = None
        self._inflight: dict[str, int] = {}
        self._schemas = SchemaCheck()
        self.reservations = SessionReservations()
        """Soft reservations and learned tool gaps, by session key (clock seconds)."""
        self.sessions = SessionBook(
            on_forget=self.reservations.end, max_per_tenant=max_sessions_per_tenant
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    # -- catalog -----------------------------------------------------------------------------
    def models(self) -> list[str]:
        return sorted({m for r in self.runtimes for m in r.models})

    def context_window(self, model: str) -> int | None:
        return self._windows.get(model)

    async def residency(self) -> dict[str, list[dict[str, Any]]]:
        """model → [{instance, state, next_slot_in_s}] (for /v1/models)."""
        out: dict[str, list[dict[str, Any]]] = {m: [] for m in self.models()}
        for status in await self._statuses(None):
            for name, res in status.models.items():
                out.setdefault(name, []).append(
                    {
                        "instance": status.instance,
                        "state": res.state.value,
                        "next_slot_in_s": round(self._wall_s(res.next_slot_in_s), 3),
                    }
                )
        return out

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    @property
    def inflight(self) -> int:
        """Calls running now."""
        return len(self._tasks)

    def refuse_new_calls(self) -> None:
        """From now on every new call gets 503 (the proxy is shutting down)."""
        self._closing = True

    def abort_calls(self) -> int:
        """Stop every running call: each client gets a 503 ("shutting down"), each call an
        error record (unless it had finished and only waited for its commit). Returns how many
        were running."""
        for task in self._tasks:
            task.cancel()
        return len(self._tasks)

    async def close(self, timeout_s: float | None = None) -> None:
        """Refuse new calls; let running ones finish for at most ``timeout_s`` (None: as
        long as they take), then abort the rest."""
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        if self._tasks:
            running = list(self._tasks)
            _, late = await asyncio.wait(running, timeout=timeout_s)
            if late:
                log.warning("aborting %d calls still running at shutdown", len(late))
                for task in late:
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)

    def _wall_s(self, clock_s: float) -> float:
        """Wall seconds of a duration in clock seconds."""
        return clock_s / self._time_scale

    @overload
    def _clock_s(self, wall_s: float) -> float: ...
    @overload
    def _clock_s(self, wall_s: None) -> None: ...
    def _clock_s(self, wall_s: float | None) -> float | None:
        """Clock seconds of a duration a client gave in wall seconds."""
        return None if wall_s is None else wall_s * self._time_scale

    def _submit(self, record: Record) -> int:
        self._last_seq = self._sink.submit(record)
        return self._last_seq

    # -- calls -------------------------------------------------------------------------------
    def use_replicas(
        self,
        owned: Callable[[str], bool],
        adopt: Callable[[str, str], Awaitable[AdoptableSession | None]],
    ) -> None:
        """Serve as one of several replicas (proxy/cluster/): ``owned(route_key)`` says
        whether this replica owns a session now (the sweep hands the others off), ``adopt
        (tenant, client id)`` finds an open session another replica held (taken over at its
        next call here)."""
        self._owned, self._adopt = owned, adopt

    async def _take_over(self, call: PreparedCall, now_s: float) -> None:
        """A named session this replica does not hold, but the store shows open: another
        replica held it before this one became its owner. Hold it under the same key, with
        its call count and last instance, so that it goes on as one session."""
        sid = call.identity.session_id
        if self._adopt is None or sid is None or self.sessions.named(call.tenant_id, sid):
            return
        stored = await self._adopt(call.tenant_id, sid)
        if stored is None:
            return
        age_s = (datetime.now(UTC) - stored.started_at).total_seconds()
        self.sessions.adopt(
            SessionState(
                key=stored.key,
                tenant_id=call.tenant_id,
                external_id=sid,
                identity_source=call.identity.source,
                model=stored.model,
                started_at=stored.started_at,
                started_s=now_s - self._clock_s(max(0.0, age_s)),
                root_key=stored.key,
                calls=stored.calls,
                last_activity_s=now_s,
                last_instance=stored.last_instance,
                route_key=call.route_key,
                adopted=True,
            )
        )
        self.reservations.adopt(stored.key, stored.last_instance)

    async def open_call(self, call: PreparedCall) -> CallHandle:
        """Find the session, route the call and start it; raises ApiError before anything
        runs."""
        tools = tools_fingerprint(call.call.tools)
        self._schemas.check(call.call, tools.digest, call.api)
        prompt_tokens = call.call.prompt_tokens()
        window = self._windows.get(call.model)
        if window is not None and prompt_tokens + call.max_tokens > window:
            raise bad_request(
                f"This model's maximum context length is {window} tokens; the request has "
                f"about {prompt_tokens} prompt tokens and asks for up to {call.max_tokens} more.",
                param="messages",
                code="context_length_exceeded",
            )
        if self._closing:
            raise unavailable("The server is shutting down; retry the call.")
        if self._sink.full or (self._durable and self._sink.failing_since is not None):
            raise unavailable(
                "The session store cannot take this call's records now; retry shortly.",
                retry_after_s=STORE_RETRY_S,
            )
        if self._inflight.get(call.tenant_id, 0) >= self._max_inflight:
            raise too_many_requests(self._max_inflight)
        statuses = await self._statuses(call.model)
        if not statuses:
            raise unavailable(f"No runtime instance hosting {call.model} is reachable right now.")
        now_s, now_at = self._clock.now(), datetime.now(UTC)
        await self._take_over(call, now_s)
        messages = call.call.messages
        conversation = Conversation.of(messages) if messages is not None else EMPTY
        try:
            found = self.sessions.resolve(
                tenant_id=call.tenant_id,
                identity=call.identity,
                model=call.model,
                conversation=conversation,
                now_s=now_s,
                now_at=now_at,
                match=messages is not None,
            )
        except SessionLimit as full:  # Retry-After: when its least recent one may idle out
            idle_in_s = full.oldest_activity_s + self._idle_timeout_s - now_s
            raise too_many_sessions(full.limit, self._wall_s(idle_in_s)) from full
        state = found.state
        if state.route_key is None:
            state.route_key = call.route_key
        shared: int | None = found.shared_tokens
        if found.how == "adopted":
            shared = None  # unknown here: the runtime's own record of the session decides
        elif shared and state.tools == tools.digest:  # the tools render ahead of the messages
            shared += tools.tokens
        state.tools = tools.digest
        reserved = self.reservations.reserved(state.key, now_s)
        try:
            decision = route(
                self._router,
                RouteRequest(
                    session_id=state.key,
                    model=call.model,
                    prompt_tokens=prompt_tokens,
                    last_instance=state.last_instance,
                    reserved_instance=reserved,
                ),
                statuses,
                self._routing,
                self._rng,
            )
        except NoInstanceError as exc:
            raise unavailable(str(exc)) from exc
        settled = self.reservations.started(
            state.key, decision.instance, now_s, concurrent=state.inflight > 0
        )
        if settled is not None:  # the session is back: a hit if routed to its reservation
            self.metrics.reservations.labels(settled.value).inc()
            self._release(state, "expired" if settled is Settled.EXPIRED else "returned", now_at)
        if state.last_instance is not None and state.last_instance != decision.instance:
            await self._by_name[state.last_instance].session_moved(state.key)
        self.metrics.decisions.labels(self._router, decision.reason).inc()
        self.metrics.sessions_found.labels(found.how).inc()
        self._submit(
            DecisionRecord(
                request_id=call.request_id,
                session_id=state.key,
                router=self._router,
                instance=decision.instance,
                reason=decision.reason,
                scores=decision.scores,
                created_at=now_at,
            )
        )
        request = self._runtime_request(call, state, shared, prompt_tokens)
        self.sessions.call_started(state, conversation, now_s)
        self.metrics.live_sessions.set(len(self.sessions))
        self._inflight[call.tenant_id] = self._inflight.get(call.tenant_id, 0) + 1
        events: asyncio.Queue[tuple[EventKind, Any]] = asyncio.Queue()
        runtime = self._by_name[decision.instance]
        task = asyncio.get_running_loop().create_task(
            self._execute(call, state, conversation, request, runtime, events, now_at)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return CallHandle(events, task, decision.instance, state.external_id, state.key, found.how)

    def _runtime_request(
        self,
        call: PreparedCall,
        state: SessionState,
        shared_tokens: int | None,
        prompt_tokens: int,
    ) -> CallRequest:
        c = call.call
        return CallRequest(
            request_id=call.request_id,
            session_id=state.key,
            model=call.model,
            prompt_tokens=prompt_tokens,
            max_output_tokens=call.max_tokens,
            call_index=state.calls,
            expected_tool_gap_s=self._clock_s(call.identity.tool_gap_hint_s),
            session_final=call.identity.final,
            stream=call.stream,
            shared_prefix_tokens=shared_tokens,
            messages=c.messages,
            prompt_text=c.prompt,
            tools=c.tools,
            tool_choice=c.tool_choice,
            sampling=c.sampling,
            reasoning_effort=c.reasoning_effort,
            parallel_tool_calls=c.parallel_tool_calls,
            template_kwargs=c.template_kwargs,
            cache_salt=tenant_salt(call.tenant_id),
        )

    async def reachable_instances(self) -> list[str]:
        """The instances whose status answers now."""
        return [status.instance for status in await self._statuses(None)]

    @property
    def drained(self) -> frozenset[str]:
        """Runtime instances being drained: no new call is routed to them."""
        return self._drained

    def set_drained(self, names: set[str]) -> None:
        self._drained = frozenset(names)

    async def _statuses(self, model: str | None) -> list[InstanceStatus]:
        """Status of every instance hosting ``model`` (all if None) that answers; an instance
        that fails is left out of this decision (and logged), not fatal. For a call (a
        ``model``), drained instances are left out too."""
        statuses = []
        for runtime in self.runtimes:
            if model is not None and (model not in runtime.models or runtime.name in self._drained):
                continue
            try:
                statuses.append(await runtime.status())
            except Exception as exc:
                log.warning("runtime %s: status failed: %r", runtime.name, exc)
        return statuses

    async def _execute(
        self,
        call: PreparedCall,
        state: SessionState,
        conversation: Conversation,
        request: CallRequest,
        runtime: RuntimeClient,
        events: asyncio.Queue[tuple[EventKind, Any]],
        arrived_at: datetime,
    ) -> CallOutcome | None:
        """Run the call; record its outcome; with durable acknowledgement, wait for the
        records' commit; only then tell the client it is done. Cancelled (shutdown): the client
        gets a 503 and the call an error record."""
        try:
            result = await self._generate(runtime, request, events)
        except asyncio.CancelledError:
            self._record_failure(call, state, request, runtime, arrived_at, SHUTDOWN, events)
            raise
        except Exception as exc:  # a runtime fault fails this call only
            self._record_failure(call, state, request, runtime, arrived_at, exc, events)
            return None
        finally:
            state.inflight -= 1
            self._inflight[call.tenant_id] -= 1
        output = result.output or ModelOutput(finish_reason="stop")
        outcome = CallOutcome(result, runtime.name, output)
        seq: int | None = None
        try:
            seq = self._finished(
                call, state, conversation, request, runtime, outcome, arrived_at, datetime.now(UTC)
            )
        except Exception:  # bookkeeping must never cost the client its answer
            log.exception("call %s: recording its outcome failed", call.request_id)
        if self._durable and seq is not None:
            try:
                async with asyncio.timeout(self._commit_timeout_s):
                    await self._sink.committed(seq)
            except asyncio.CancelledError:
                events.put_nowait(("error", unavailable(SHUTDOWN_BEFORE_COMMIT)))
                raise
            except TimeoutError:
                log.error("call %s: its records were not committed in time", call.request_id)
                events.put_nowait(("error", unavailable(NOT_COMMITTED)))
                return outcome
        events.put_nowait(("done", outcome))
        return outcome

    async def _generate(
        self,
        runtime: RuntimeClient,
        request: CallRequest,
        events: asyncio.Queue[tuple[EventKind, Any]],
    ) -> CallResult:
        """Pass the runtime's events on; the call's result (``RuntimeError`` if the runtime
        ended without one). The runtime's stream is read to its end, and closed when the
        call is cancelled."""
        result: CallResult | None = None
        async with contextlib.aclosing(runtime.generate(request)) as stream:
            async for event in stream:
                if isinstance(event, FirstToken):
                    events.put_nowait(("first", event.delta))
                elif isinstance(event, TokenDelta):
                    events.put_nowait(("delta", event.delta))
                elif isinstance(event, Finished):
                    result = event.result
        if result is None:
            raise RuntimeError("the runtime ended the call without a result")
        return result

    def _record_failure(
        self,
        call: PreparedCall,
        state: SessionState,
        request: CallRequest,
        runtime: RuntimeClient,
        arrived_at: datetime,
        error: BaseException | str,
        events: asyncio.Queue[tuple[EventKind, Any]],
    ) -> None:
        """The call failed: an error record, then the error to the client (whatever happens to
        the record)."""
        if isinstance(error, str):
            api_error, message = unavailable(error), error
        else:
            message = f"runtime {runtime.name} failed the call: {error!r}"
            api_error = error if isinstance(error, ApiError) else unavailable(message)
            if isinstance(error, CallRejected):
                api_error = bad_request(str(error), param=error.param, code=error.code)
        try:
            self._submit(
                _call_record(
                    call,
                    state,
                    request,
                    runtime,
                    arrived_at,
                    datetime.now(UTC),
                    status="error",
                    prompt_tokens=request.prompt_tokens,
                    error=message[:500],
                )
            )
            self._write_session(state, datetime.now(UTC))
        except Exception:
            log.exception("call %s: recording its failure failed", call.request_id)
        finally:
            events.put_nowait(("error", api_error))

    def _finished(
        self,
        call: PreparedCall,
        state: SessionState,
        conversation: Conversation,
        request: CallRequest,
        runtime: RuntimeClient,
        outcome: CallOutcome,
        arrived_at: datetime,
        finished_at: datetime,
    ) -> int:
        """Record a finished call; returns the sequence number of its last record. A session
        that ended while the call ran (its client's or an admin's end) stays ended: the call
        is recorded, and nothing more of the session is kept (no index entry, no reservation,
        no session record that would reopen it)."""
        result, output = outcome.result, outcome.output
        state.last_instance = runtime.name
        state.last_finish_reason = output.finish_reason
        if call.call.messages is not None and not state.ended:
            reply = fingerprint(output.as_message())
            self.sessions.call_finished(state, conversation, reply, self._clock.now())
        wall = self._wall_s
        self.metrics.call_latency.labels(call.model).observe(wall(result.latency_s))
        self.metrics.ttft.labels(call.model).observe(wall(result.first_token_s - result.arrival_s))
        self.metrics.tokens(result.prompt_tokens, result.cached_tokens)
        self._submit(
            _call_record(
                call,
                state,
                request,
                runtime,
                arrived_at,
                finished_at,
                status="ok",
                queue_s=wall(result.queue_s),
                slot_wait_s=wall(result.slot_wait_s),
                prefill_s=wall(result.first_token_s - result.admitted_s),
                decode_s=wall(result.finished_s - result.first_token_s),
                **_engine_parts(result, wall),
                prompt_tokens=result.prompt_tokens,
                cached_tokens=result.cached_tokens,
                output_tokens=result.output_tokens,
                finish_reason=output.finish_reason,
                kv_source=result.kv_source.value,
                tool_gap_hint_s=call.identity.tool_gap_hint_s,
            )
        )
        if call.extra_records is not None:
            for record in call.extra_records(outcome):
                self._submit(record)
        if state.ended:
            return self._last_seq
        single = call.call.messages is None and not call.identity.explicit
        final = call.identity.final or single
        taken = self.reservations.finished(
            state.key,
            runtime.name,
            self._clock.now(),
            final=final,
            asks_tools=bool(output.tool_calls) or output.finish_reason == "tool_calls",
            hint_s=self._clock_s(call.identity.tool_gap_hint_s),
        )
        if final:
            self._end(state, "final", finished_at)
            return self._last_seq
        if taken is not None:
            self._taken(state, taken, finished_at)
        self._write_session(state, finished_at)
        return self._last_seq

    # -- reservations ------------------------------------------------------------------------
    # When to reserve, for how long, and how a reservation ends are ``self.reservations``'
    # (core.reservations.SessionReservations); here: its records and metrics, in wall time.
    def _taken(self, state: SessionState, held: SoftReservation, now_at: datetime) -> None:
        """Record a reservation just taken (releasing the one it replaces)."""
        self._release(state, "replaced", now_at)
        state.reservation = ReservationRecord(
            reservation_id=uuid.uuid4().hex,
            session_id=state.key,
            instance=held.instance,
            held_bytes=0.0,
            created_at=now_at,
            expected_return_at=now_at + timedelta(seconds=self._wall_s(held.expected_gap_s)),
            expires_at=now_at + timedelta(seconds=self._wall_s(held.expires_s - held.created_s)),
        )
        self.metrics.reservations.labels("taken").inc()
        self._submit(state.reservation)

    def _release(self, state: SessionState, reason: str, now_at: datetime) -> None:
        """Record the release of the session's reservation (if it has one recorded)."""
        if state.reservation is None:
            return
        self._submit(replace(state.reservation, released_at=now_at, release_reason=reason))
        state.reservation = None

    async def _sweep(self) -> None:
        while True:
            await self._clock.sleep(SWEEP_S)
            await self.sweep_once()

    async def sweep_once(self) -> None:
        """Release expired reservations; end sessions idle beyond the timeout."""
        now_s, now_at = self._clock.now(), datetime.now(UTC)
        for held in self.reservations.sweep(now_s):
            state = self.sessions.get(held.session)
            if state is not None and state.reservation is not None:
                self.metrics.reservations.labels("expired").inc()
                self._release(state, "expired", now_at)
        for state in self.sessions.idle(now_s, self._idle_timeout_s):
            await self._end_on_runtime(state)
            self._end(state, "idle", now_at)
        if self._owned is not None:
            self._hand_off(self._owned)

    def _hand_off(self, owned: Callable[[str], bool]) -> None:
        """Forget, without ending them, the sessions another replica owns now (a replica
        joined): their calls go there, and that replica takes them over (``_take_over``).
        Ending them would release their KV on the runtime under their new owner."""
        for state in list(self.sessions):
            key = state.route_key
            if key is not None and state.inflight == 0 and not owned(key):
                self.sessions.forget(state)

    # -- hints and ends ----------------------------------------------------------------------
    async def hint(
        self, session_id: str, tenant_id: str, expected_s: float | None, tool: str | None
    ) -> bool:
        """Record a tool-gap hint; reserve on the session's last instance. False: no live
        session of that id for this tenant."""
        now_at = datetime.now(UTC)
        state = self.sessions.named(tenant_id, session_id)
        if state is None or state.ended:
            return False
        self._submit(HintRecord(state.key, now_at, expected_s, tool))
        expected = self._clock_s(expected_s)
        if state.last_instance is not None and expected is not None:
            await self._by_name[state.last_instance].hint(state.key, expected)
            taken = self.reservations.hint(
                state.key, self._clock.now(), expected, concurrent=state.inflight > 0
            )
            if taken is not None:
                self._taken(state, taken, now_at)
        return True

    async def end_session(self, session_id: str, reason: str, tenant_id: str | None) -> bool:
        """End a live session and its children. ``tenant_id`` None (the admin): ``session_id``
        is a key, or a client's id that only one tenant uses. False if there is no such live
        session."""
        if tenant_id is None:
            state = self.sessions.get(session_id)
            if state is None:
                named = self.sessions.by_external_id(session_id)
                if len(named) > 1:
                    keys = ", ".join(s.key for s in named)
                    raise ApiError(
                        409,
                        f"Several tenants have a live session {session_id!r}; end one by its "
                        f"key ({keys}).",
                        code="ambiguous_session",
                    )
                state = named[0] if named else None
        else:
            state = self.sessions.named(tenant_id, session_id)
        if state is None or state.ended:
            return False
        now_at = datetime.now(UTC)
        for child in [*self.sessions.children(state.key), state]:
            self._submit(HintRecord(child.key, now_at, None, None, kind="end"))
            await self._end_on_runtime(child)
            self._end(child, reason, now_at)
        return True

    async def _end_on_runtime(self, state: SessionState) -> None:
        if state.last_instance is not None:
            await self._by_name[state.last_instance].end_session(state.key)

    def _end(self, state: SessionState, reason: str, now_at: datetime) -> None:
        if state.reservation is not None:
            self.metrics.reservations.labels("ended").inc()
            self._release(state, "ended", now_at)
        self.metrics.sct.labels(state.model).observe(
            self._wall_s(self._clock.now() - state.started_s)
        )
        self.sessions.forget(state)
        self._write_session(state, now_at, ended_reason=reason)
        self.metrics.live_sessions.set(len(self.sessions))

    def _write_session(
        self, state: SessionState, now_at: datetime, ended_reason: str | None = None
    ) -> None:
        if ended_reason is not None:
            status = "ended"
        elif state.reservation is not None:
            status = "in_tool"
        else:
            status = "active"
        self._submit(
            SessionRecord(
                session_id=state.key,
                tenant_id=state.tenant_id,
                model=state.model,
                started_at=state.started_at,
                last_call_at=now_at,
                parent_session_id=state.parent_key,
                state=status,
                ended_at=now_at if ended_reason else None,
                end_reason=ended_reason,
                external_id=state.external_id,
                identity_source=state.identity_source,
            )
        )
