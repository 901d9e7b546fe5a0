"""Running a routed call: the ``CallRequest`` the runtime gets, a task of its own per call (so a
call's records never depend on its client; a client that disconnects abandons it:
``CallRunner.abandon``), the runtime's events passed on as they come, the outcome recorded,
and, with durable acknowledgement, its records committed before the client hears that the call
is done. A runtime the call never reached (``RuntimeUnreachable``: no connection; nothing was
sent) is no fault of the call: it is routed again among the others (``Reroute``, the
gateway's), each instance tried at most once, and fails only when none is left.

The runner passes on what the engine produced (``OutputDelta``s, then a ``ModelOutput``) and
never writes output of its own. It notes what the engine produced as it passes (``Progress``),
and when the call ends, however it ends, tells its ``on_settled`` the tokens it is charged
(proxy/callpath/limits.py ``charge``: a stream cancelled near its end is charged nearly all).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from talaria.core.calls import ModelOutput
from talaria.core.clock import TimeScale
from talaria.core.types import (
    CallRejected,
    CallRequest,
    CallResult,
    Finished,
    FirstToken,
    TokenDelta,
)
from talaria.proxy.callpath.keeper import SessionKeeper
from talaria.proxy.callpath.limits import Progress, charge
from talaria.proxy.callpath.recorder import Recorder
from talaria.proxy.callpath.stages import GatewayCall
from talaria.proxy.contract.calls import SHUTDOWN, CallOutcome, Events, PreparedCall, RuntimeClock
from talaria.proxy.contract.errors import ApiError, bad_request, unavailable
from talaria.proxy.runtimes.base import RuntimeClient, RuntimeUnreachable
from talaria.proxy.sessions.conversation import Conversation
from talaria.proxy.sessions.state import Resolution

log = logging.getLogger("talaria.proxy.callpath.gateway")  # the gateway's part: its log name

CLIENT_GONE = "The client disconnected before the call ended; its generation was stopped."
"""The record of a call whose client went away (status ``cancelled``)."""

NOT_COMMITTED = (
    "The call ran, but the session store has not committed its records in time (they are "
    "kept, and written when the store recovers); retry the call."
)
SHUTDOWN_BEFORE_COMMIT = (
    "The server is shutting down before this call's records were committed; retry the call."
)


def tenant_digest(tenant_id: str) -> str:
    """The tenant as the runtime knows it (its fair queue's tenant, its prefix-cache salt): a
    digest, so the runtime never learns tenant ids."""
    return hashlib.blake2b(tenant_id.encode(), digest_size=12).hexdigest()


def runtime_request(ctx: GatewayCall, time: TimeScale) -> CallRequest:
    """What the runtime is asked to run: the resolved call (``ctx``), under its thread's key on
    the runtime (``SessionState.runtime_key``), with the scheduling fields (call index, hints
    in clock seconds, the shared prefix estimate, a child's ``parent``: its key on the runtime
    and the prefix they share, proxy/sessions/lineage.py) and the fair queue's (the tenant's
    digest and weight, the call's class, its deadline in clock seconds) and the agent's kind,
    which the node learns tool gaps by."""
    call, found = ctx.call, ctx.resolution
    state, parent = found.state, found.parent
    tenant = tenant_digest(call.tenant_id)
    return CallRequest(
        request_id=call.request_id,
        session_key=state.runtime_key(found.thread),
        model=call.model,
        prompt_tokens=ctx.prompt_tokens,
        max_output_tokens=call.max_tokens,
        call_index=state.calls,
        expected_tool_gap_s=time.clock(call.identity.tool_gap_hint_s),
        session_final=call.identity.final,
        stream=call.stream,
        shared_prefix_tokens=ctx.shared_tokens,
        call=call.content,
        cache_salt=tenant,
        output_tokens=call.max_tokens if call.content.sampling.ignore_eos else None,
        tenant=tenant,
        tenant_weight=call.share.weight,
        agent=call.identity.agent,
        priority=call.share.priority,
        deadline_s=time.clock(call.share.deadline_s),
        parent_session_key=parent.key,
        parent_prefix_tokens=parent.prefix_tokens,
    )


@dataclass
class RunningCall:
    """One call as it runs: its context in the gateway (``ctx``: the call, the session and
    thread it resolved to, the conversation it carries, when it arrived), what the runtime
    was asked, the runtime, the events its client reads, the clock of its time in the
    runtime, and what the engine has produced of it so far."""

    ctx: GatewayCall
    request: CallRequest
    runtime: RuntimeClient
    events: Events = field(default_factory=asyncio.Queue)
    clock: RuntimeClock = field(default_factory=RuntimeClock)
    progress: Progress = field(init=False)

    def __post_init__(self) -> None:
        request = self.request
        self.progress = Progress(request.prompt_tokens, request.max_output_tokens, request.stream)

    @property
    def call(self) -> PreparedCall:
        """The call."""
        return self.ctx.call

    @property
    def found(self) -> Resolution:
        """The session (and thread) it resolved to."""
        return self.ctx.resolution

    @property
    def conversation(self) -> Conversation:
        """The conversation it carries."""
        return self.ctx.conversation

    @property
    def arrived_at(self) -> datetime:
        """When it was admitted (UTC)."""
        return self.ctx.now_at


Reroute = Callable[["RunningCall", frozenset[str]], Awaitable[RuntimeClient | None]]
"""Another instance for a call whose instance could not be reached, leaving out the instances
named (those already tried); None: none is left."""


class CallRunner:
    """The running calls: their tasks, and how many each tenant has in flight."""

    def __init__(
        self,
        recorder: Recorder,
        keeper: SessionKeeper,
        reroute: Reroute,
        settled: Callable[[str, str], None],
    ) -> None:
        self._recorder = recorder
        self._keeper = keeper
        self._reroute = reroute
        self._settled = settled
        """Told the instance and model of a call routed there that ended or left (the pool's
        own-call count)."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._inflight: dict[str, int] = {}
        self._abandoned: set[asyncio.Task[Any]] = set()

    @property
    def running(self) -> int:
        """Calls running now."""
        return len(self._tasks)

    def inflight_of(self, tenant_id: str) -> int:
        """The tenant's calls running now."""
        return self._inflight.get(tenant_id, 0)

    def start(self, run: RunningCall) -> asyncio.Task[CallOutcome | None]:
        """Start ``run`` on its runtime in a task of its own; the task."""
        tenant = run.call.tenant_id
        self._inflight[tenant] = self._inflight.get(tenant, 0) + 1
        task = asyncio.get_running_loop().create_task(self._execute(run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def abandon(self, task: asyncio.Task[Any]) -> None:
        """The call's client went away before its end: cancel the call. Its runtime stream is
        closed, so the engine aborts the generation and frees its slot and KV blocks (a killed
        agent's 32,000-token request no longer runs on for minutes); recorded ``cancelled``."""
        if task.done():
            return
        self._abandoned.add(task)
        task.add_done_callback(self._abandoned.discard)
        _cancel_once_started(task)

    def abort(self) -> int:
        """Cancel every running call (each ends with a 503 and an error record); how many."""
        for task in self._tasks:
            _cancel_once_started(task)
        return len(self._tasks)

    async def close(self, timeout_s: float | None) -> None:
        """Let the running calls finish for at most ``timeout_s`` (None: as long as they
        take), then abort the rest."""
        if not self._tasks:
            return
        _, late = await asyncio.wait(list(self._tasks), timeout=timeout_s)
        if late:
            log.warning("aborting %d calls still running at shutdown", len(late))
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    async def _execute(self, run: RunningCall) -> CallOutcome | None:
        """Run the call; record its outcome; with durable acknowledgement, wait for the
        records' commit; only then tell the client it is done. Cancelled (shutdown): the client
        gets a 503 and the call an error record."""
        call, events = run.call, run.events
        try:
            result = await self._generate_where_reachable(run)
        except asyncio.CancelledError:
            gone = asyncio.current_task() in self._abandoned
            _settle(run, charge(run.progress, finished_tokens=None, cancelled=True))
            self._fail(run, CLIENT_GONE if gone else SHUTDOWN)
            raise
        except Exception as exc:  # a runtime fault fails this call only
            _settle(run, charge(run.progress, finished_tokens=None, cancelled=False))
            self._fail(run, exc)
            return None
        finally:
            self._keeper.call_ended(run.found.state, run.found.thread)
            self._inflight[call.tenant_id] -= 1
            self._settled(run.runtime.name, run.call.model)
        _settle(run, result.prompt_tokens + result.output_tokens)
        output = result.output or ModelOutput(finish_reason="stop")
        outcome = CallOutcome(result, run.runtime.name, output)
        seq: int | None = None
        try:
            seq = self._finish(run, outcome)
        except Exception:  # bookkeeping must never cost the client its answer
            log.exception("call %s: recording its outcome failed", call.request_id)
        if seq is not None:
            try:
                committed = await self._recorder.committed(seq, call.request_id)
            except asyncio.CancelledError:
                events.put_nowait(("error", unavailable(SHUTDOWN_BEFORE_COMMIT)))
                raise
            if not committed:
                events.put_nowait(("error", unavailable(NOT_COMMITTED)))
                return outcome
        events.put_nowait(("done", outcome))
        return outcome

    async def _generate_where_reachable(self, run: RunningCall) -> CallResult:
        """Run the call on ``run.runtime``; while the instance cannot be reached, on the one
        ``Reroute`` gives instead (``run.runtime`` then names it)."""
        tried: set[str] = set()
        while True:
            try:
                return await _generate(run, run.runtime)
            except RuntimeUnreachable as exc:
                tried.add(run.runtime.name)
                elsewhere = await self._reroute(run, frozenset(tried))
                if elsewhere is None or elsewhere.name in tried:
                    if elsewhere is not None:  # routed (and counted) there: not going
                        self._settled(elsewhere.name, run.call.model)
                    raise
                log.warning("call %s: %s; routed again to %s", run.call.request_id, exc,
                            elsewhere.name)  # fmt: skip
                self._settled(run.runtime.name, run.call.model)
                run.runtime = elsewhere

    def _finish(self, run: RunningCall, outcome: CallOutcome) -> int:
        """Keep a finished call: the session continues from its reply, its records, then the
        session's route preference or end. Returns the sequence number of its last record."""
        finished_at = datetime.now(UTC)
        call, found = run.call, run.found
        self._keeper.replied(
            call, found.state, run.conversation, outcome.instance, outcome.output, found.thread
        )
        self._recorder.call_finished(call, found, run.request, outcome, run.arrived_at, finished_at)
        self._keeper.after_call(
            call, found.state, outcome.instance, outcome.output, finished_at, found.thread
        )
        return self._recorder.last_seq

    def _fail(self, run: RunningCall, error: BaseException | str) -> None:
        """The call failed: an error record, then the error to the client (whatever happens to
        the record)."""
        status = "cancelled" if error is CLIENT_GONE else "error"
        if isinstance(error, str):
            api_error, message = unavailable(error), error
        else:
            message = f"runtime {run.runtime.name} failed the call: {error!r}"
            api_error = error if isinstance(error, ApiError) else unavailable(message)
            if isinstance(error, CallRejected):
                api_error = bad_request(str(error), param=error.param, code=error.code)
        try:
            self._recorder.call_failed(
                run.call, run.found, run.request, run.runtime.name, run.arrived_at, message,
                status=status,
            )  # fmt: skip
        except Exception:
            log.exception("call %s: recording its failure failed", run.call.request_id)
        finally:
            run.events.put_nowait(("error", api_error))


def _settle(run: RunningCall, tokens: int) -> None:
    """Tell the call's ``on_settled`` the tokens it is charged (its key's rate limits)."""
    if run.call.on_settled is None:
        return
    try:
        run.call.on_settled(tokens)
    except Exception:  # bookkeeping must never cost the client its answer
        log.exception("call %s: settling its rate limit reservation failed", run.call.request_id)


def _cancel_once_started(task: asyncio.Task[Any]) -> None:
    """Cancel a call's task one callback from now, after its first step: a task cancelled
    before that step never runs its body, so the call would get no record, and its session
    and tenant would count it in flight for good (the session never idles out). The task's
    first step is already scheduled, and the loop runs callbacks in the order they were
    scheduled."""
    asyncio.get_running_loop().call_soon(task.cancel)


async def _generate(run: RunningCall, runtime: RuntimeClient) -> CallResult:
    """Pass the runtime's events on (and note them in ``run.progress``); the call's result
    (``RuntimeError`` if the runtime ended without one). The runtime's stream is read to its
    end, and closed when the call is cancelled; ``run.clock`` times it."""
    events, clock, progress = run.events, run.clock, run.progress
    result: CallResult | None = None
    clock.started = time.perf_counter()
    try:
        async with contextlib.aclosing(runtime.generate(run.request)) as stream:
            async for event in stream:
                if isinstance(event, FirstToken):
                    progress.produced(1)
                    events.put_nowait(("first", event.delta))
                elif isinstance(event, TokenDelta):
                    progress.produced(event.tokens)
                    events.put_nowait(("delta", event.delta))
                elif isinstance(event, Finished):
                    result = event.result
    finally:
        clock.ended = time.perf_counter()
    if result is None:
        raise RuntimeError("the runtime ended the call without a result")
    return result
