"""The recorder: what the proxy keeps of its calls. It builds the call's records (its routing
decision, its outcome, its session's row) in wall seconds, hands them to the batched writer
(``RecordSink``), observes the call's metrics, and, with durable acknowledgement, waits for
the records' commit before a call may tell its client it is done."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from talaria.core.clock import TimeScale
from talaria.core.routing import RoutingDecision
from talaria.core.types import CallRequest, CallResult
from talaria.proxy.contract.calls import CallOutcome, PreparedCall
from talaria.proxy.contract.metrics import ProxyMetrics
from talaria.proxy.contract.records import CallRecord, DecisionRecord, Record, SessionRecord
from talaria.proxy.sessions.state import Resolution, SessionState

log = logging.getLogger("talaria.proxy.callpath.gateway")  # the gateway's part: its log name

ERROR_CHARS = 500
"""An error record keeps this much of the error's message."""


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


def engine_parts(result: CallResult, wall: Callable[[float], float]) -> dict[str, float]:
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


class Recorder:
    """Records and metrics of calls and sessions, and the durable-commit wait. ``durable``:
    a call waits for its records' commit (at most ``commit_timeout_s``) before it is done."""

    def __init__(
        self,
        sink: RecordSink,
        metrics: ProxyMetrics,
        time: TimeScale,
        *,
        router: str,
        durable: bool,
        commit_timeout_s: float,
    ) -> None:
        self.metrics = metrics
        self._sink = sink
        self._time = time
        self._router = router
        self._durable = durable
        self._commit_timeout_s = commit_timeout_s
        self.last_seq = 0
        """The sequence number of the last record submitted."""

    def submit(self, record: Record) -> int:
        """Hand ``record`` to the writer; its sequence number."""
        self.last_seq = self._sink.submit(record)
        return self.last_seq

    @property
    def refusing(self) -> bool:
        """Whether the store cannot take a new call's records now: its queue is full, or
        (with durable acknowledgement) its writes are failing."""
        return self._sink.full or (self._durable and self._sink.failing_since is not None)

    async def committed(self, seq: int, request_id: str) -> bool:
        """With durable acknowledgement, wait until record ``seq`` is committed: False (and
        logged) when that takes longer than the commit timeout. True at once otherwise."""
        if not self._durable:
            return True
        try:
            async with asyncio.timeout(self._commit_timeout_s):
                await self._sink.committed(seq)
        except TimeoutError:
            log.error("call %s: its records were not committed in time", request_id)
            return False
        return True

    def decision(
        self,
        call: PreparedCall,
        state: SessionState,
        decision: RoutingDecision,
        how: str,
        at: datetime,
    ) -> None:
        """The call was routed (its session found ``how``): the decision's record and metrics."""
        self.metrics.decisions.labels(self._router, decision.reason).inc()
        self.metrics.sessions_found.labels(how).inc()
        if how == "drifted":
            self.metrics.prefix_drift.inc()
        self.submit(
            DecisionRecord(
                request_id=call.request_id,
                session_key=state.key,
                router=self._router,
                instance=decision.instance,
                reason=decision.reason,
                scores=decision.scores,
                created_at=at,
            )
        )

    def call_failed(
        self,
        call: PreparedCall,
        found: Resolution,
        request: CallRequest,
        instance: str,
        arrived_at: datetime,
        message: str,
        status: str = "error",
    ) -> None:
        """The call failed with ``message`` (``status``: ``error``, or ``cancelled`` when its
        client went away): its record and its session's."""
        now_at = datetime.now(UTC)
        self.submit(
            _call_record(
                call,
                found,
                request,
                instance,
                arrived_at,
                now_at,
                status=status,
                prompt_tokens=request.prompt_tokens,
                error=message[:ERROR_CHARS],
            )
        )
        self.session(found.state, datetime.now(UTC))

    def call_finished(
        self,
        call: PreparedCall,
        found: Resolution,
        request: CallRequest,
        outcome: CallOutcome,
        arrived_at: datetime,
        finished_at: datetime,
    ) -> None:
        """The call finished: its latency, TTFT and token metrics, its record (in wall
        seconds), and the records the API adds to it (``PreparedCall.extra_records``)."""
        result, output = outcome.result, outcome.output
        wall = self._time.wall
        self.metrics.call_latency.labels(call.model).observe(wall(result.latency_s))
        self.metrics.ttft.labels(call.model).observe(wall(result.first_token_s - result.arrival_s))
        self.metrics.tokens(result.prompt_tokens, result.cached_tokens)
        self.submit(
            _call_record(
                call,
                found,
                request,
                outcome.instance,
                arrived_at,
                finished_at,
                status="ok",
                queue_s=wall(result.queue_s),
                slot_wait_s=wall(result.slot_wait_s),
                prefill_s=wall(result.first_token_s - result.admitted_s),
                decode_s=wall(result.finished_s - result.first_token_s),
                **engine_parts(result, wall),
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
                self.submit(record)

    def session(
        self, state: SessionState, now_at: datetime, ended_reason: str | None = None
    ) -> None:
        """The session's record as of ``now_at``: ended (with ``ended_reason``), in a tool
        (it holds a route preference) or active."""
        if ended_reason is not None:
            status = "ended"
        elif state.has_preference:
            status = "in_tool"
        else:
            status = "active"
        self.submit(
            SessionRecord(
                session_key=state.key,
                tenant_id=state.tenant_id,
                model=state.model,
                started_at=state.started_at,
                last_call_at=now_at,
                parent_session_key=state.parent_key,
                state=status,
                ended_at=now_at if ended_reason else None,
                end_reason=ended_reason,
                session_id=state.session_id,
                identity_source=state.identity_source,
                agent=state.agent or None,
            )
        )


def _call_record(
    call: PreparedCall,
    found: Resolution,
    request: CallRequest,
    instance: str,
    arrived_at: datetime,
    finished_at: datetime,
    **outcome: Any,
) -> CallRecord:
    """The call's record: who and when, plus ``outcome`` (status, tokens, timings or error)."""
    return CallRecord(
        request_id=call.request_id,
        session_key=found.state.key,
        call_index=request.call_index,
        model=call.model,
        instance=instance,
        arrived_at=arrived_at,
        finished_at=finished_at,
        stream=call.stream,
        api=call.api,
        how=found.how,
        thread=found.thread,
        drift_at=found.drift_at,
        normalised=list(call.normalised.parts) if call.normalised is not None else None,
        priority_asked=asked.value if (asked := call.identity.priority) is not None else None,
        priority_served=call.share.priority.value,
        **outcome,
    )
