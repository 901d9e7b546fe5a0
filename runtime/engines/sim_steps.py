"""The simulated engine's iteration loop: continuous batching timed by the cost model.

Each iteration (vLLM V1 style, chunked prefill on) takes every ready sequence: decoding ones add
one token each, then prefilling ones take chunks of the remaining token budget
(``max_num_batched_tokens``) in admission order. The iteration lasts ``CostModel.step_time_s``
(stretched by the node's other busy engines, ``DeviceShare``). A step that completes a
sequence's prefill also samples its first token. When every running sequence is decoding, the
loop jumps ahead to the first finish in one sleep (the steps are summed exactly), and is
interrupted at the next step boundary if a new sequence becomes ready meanwhile.

The fair queue's rule 5 holds lower-class sequences out of the steps with the same
``ClassHolds`` a vLLM engine uses (runtime/engines/class_holds.py): decided when a sequence
joins the steps or leaves them, by the cost model's decode step, so that a decision does not
depend on how often the loop happens to be woken in between.
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from talaria.core.calls import OutputDelta
from talaria.core.clock import Clock
from talaria.core.types import (
    CallResult,
    EngineTimes,
    Finished,
    FirstToken,
    GenerationEvent,
    TokenDelta,
)
from talaria.runtime.costmodel import CostModel, PrefillChunk
from talaria.runtime.engine import Admission, call_result
from talaria.runtime.engines.class_holds import ClassHolds, Ticket
from talaria.runtime.engines.sim_kv import SimKv
from talaria.runtime.engines.sim_reply import ReplyStream
from talaria.runtime.memory.resources import DeviceShare, PcieLink

STREAM_STEPS = 8
"""While a streaming call decodes, the engine wakes at least every this many steps to hand
out its new tokens (a replay without streaming callers jumps straight to the next finish)."""


@dataclass(eq=False)
class SimSeq:
    """One admitted call in the loop: what is left of its prefill and output, its context, and
    the futures and queue its ``events`` stream reads."""

    admission: Admission
    prefill_left: int
    context: int
    output_left: int
    restored_bytes: float
    recomputed_tokens: int
    ready: bool = False
    ticket: Ticket | None = None
    """Its place in rule 5's holds (``ClassHolds``) from when it is ready until it leaves."""
    output_done: int = 0
    first_token_s: float | None = None
    queued_s: float | None = None
    """When it became ready (intake and KV moves done) to join a step."""
    scheduled_s: float | None = None
    """When the first step that took a chunk of it began."""
    first: asyncio.Future[float] = field(default_factory=lambda: _loop().create_future())
    done: asyncio.Future[CallResult] = field(default_factory=lambda: _loop().create_future())
    aborted: bool = False
    """Its consumer left before its end (``StepLoop.abort``): a step in flight skips it."""
    deltas: asyncio.Queue[TokenDelta] | None = None
    reply: ReplyStream | None = None
    first_delta: OutputDelta | None = None

    @property
    def preempted(self) -> int:
        """Times it was held out of the steps for a higher class."""
        return 0 if self.ticket is None else self.ticket.preempted


def _loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


class StepLoop:
    """The running sequences of one simulated engine and the task that steps them."""

    def __init__(
        self,
        model: str,
        cost: CostModel,
        kv: SimKv,
        pcie: PcieLink,
        clock: Clock,
        node: str,
        device: DeviceShare,
    ) -> None:
        self._model = model
        self._cost = cost
        self._kv = kv
        self._pcie = pcie
        self._clock = clock
        self._node = node
        self._device = device
        self.seqs: list[SimSeq] = []
        """Admitted and not finished, in admission order."""
        self._by_id: dict[str, SimSeq] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.busy_s = 0.0
        """The GPU's work so far (unstretched by co-residents)."""
        self.steps = 0
        self._idle_since = -math.inf
        """When the engine last ran out of work (−inf: never ran)."""
        self._step_shapes: set[int] = set()
        """Token counts of the steps run so far (``_shape_s``)."""
        self.holds = ClassHolds(lambda batch, context: cost.decode_step_time_s(batch, context))
        """Rule 5 of the fair queue (``holds.rule``; None: every call steps)."""

    def runs(self, session_key: str) -> bool:
        """Whether a call of the session is admitted and not finished here."""
        return any(s.admission.request.session_key == session_key for s in self.seqs)

    def idle_s(self, now: float) -> float:
        """How long the engine has had nothing to run (0 while it runs something)."""
        return 0.0 if self.seqs else now - self._idle_since

    def add(self, seq: SimSeq, transfer_bytes: float, intake_s: float) -> None:
        """Take an admitted sequence; it joins the steps once ``transfer_bytes`` of KV have
        moved over PCIe and ``intake_s`` has passed, whichever is later."""
        self.seqs.append(seq)
        self._by_id[seq.admission.request.request_id] = seq
        if transfer_bytes > 0 or intake_s > 0:
            asyncio.get_running_loop().create_task(self._ready_later(seq, transfer_bytes, intake_s))
        else:
            self._set_ready(seq)

    async def _ready_later(self, seq: SimSeq, nbytes: float, intake_s: float) -> None:
        """Ready once its KV has moved (``nbytes`` over PCIe) and ``intake_s`` has passed since
        admission, whichever is later (the two overlap)."""
        start = self._clock.now()
        if nbytes > 0:
            await self._pcie.transfer(self._cost.kv_transfer_time_s(nbytes), nbytes, priority=0)
        left = intake_s - (self._clock.now() - start)
        if left > 0:
            await self._clock.sleep(left)
        self._set_ready(seq)

    @property
    def preemptions(self) -> int:
        """Times a running call was held out of the steps for a higher class."""
        return self.holds.preemptions

    def _set_ready(self, seq: SimSeq) -> None:
        seq.ready = True
        seq.queued_s = self._clock.now()
        rank = seq.admission.request.priority.rank
        seq.ticket = self.holds.enter(rank, seq.context + seq.prefill_left)
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._serve())

    async def events(self, admission: Admission) -> AsyncIterator[GenerationEvent]:
        """The admitted call's events: ``FirstToken``, ``TokenDelta``s if it streams, then
        ``Finished``. A consumer that leaves first aborts the sequence (:meth:`abort`): it is
        still in the steps then. (Not "its ``done`` is pending": a consumer cancelled while it
        awaits ``done`` cancels that future too, and the sequence would generate on to its end
        and fail the step task there, stranding every other call of the engine.)"""
        seq = self._by_id[admission.request.request_id]
        try:
            first_s = await seq.first
            yield FirstToken(first_s, admission.cached_tokens, admission.kv_source, seq.first_delta)
            if seq.deltas is not None:
                while not seq.done.done() or not seq.deltas.empty():
                    if not seq.deltas.empty():
                        yield seq.deltas.get_nowait()
                        continue
                    getter = asyncio.ensure_future(seq.deltas.get())
                    pending: list[asyncio.Future[Any]] = [getter, seq.done]
                    try:
                        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        if not getter.done():
                            getter.cancel()
                    if getter.done() and not getter.cancelled():
                        yield getter.result()
            result = await seq.done
        finally:
            self._by_id.pop(admission.request.request_id, None)
            self.abort(seq)
        yield Finished(result)

    def abort(self, seq: SimSeq) -> None:
        """Stop a sequence before its end, as vLLM's abort does: it leaves the steps, and its
        KV (prompt and the output so far) is released to the session as a finished call's.
        Nothing for a sequence no longer in the steps (finished, or aborted already)."""
        if seq not in self.seqs:
            return
        seq.aborted = True
        self.seqs.remove(seq)
        self._leave(seq)
        now = self._clock.now()
        if not self.seqs:
            self._idle_since = now
        request = seq.admission.request
        self._kv.release(request, seq.output_done, now, self.runs(request.session_key))
        for future in (seq.first, seq.done):
            if not future.done():
                future.cancel()
        self._wake.set()

    # -- timing ----------------------------------------------------------------------------
    def _step_s(self, step_s: float) -> float:
        """The step's time with the other busy engines of the node (``DeviceShare``, α from
        the profile); the roofline's fixed step overhead is host time; a fitted step is
        measured whole, and its α was measured whole too."""
        profile = self._cost.profile
        host = profile.step_overhead_s if self._cost.fit is None else 0.0
        return self._device.stretch(self._model, step_s, host, profile.coresident_interference)

    def _shape_s(self, tokens: int) -> float:
        """The cost model's ``new_shape_s`` the first time the engine runs a step of ``tokens``
        tokens, 0 after (the engine keeps what it built for that shape)."""
        if tokens in self._step_shapes:
            return 0.0
        self._step_shapes.add(tokens)
        return self._cost.new_shape_s()

    # -- the iteration loop ----------------------------------------------------------------
    async def _serve(self) -> None:
        try:
            await self._serve_ready()
        finally:
            self._device.set_busy(self._model, False, self._wake)

    async def _serve_ready(self) -> None:
        while True:
            ready = self._by_class([s for s in self.seqs if s.ready])
            if not ready:
                return
            self._device.set_busy(self._model, True, self._wake)
            self._wake.clear()
            decoding = [s for s in ready if s.prefill_left == 0]
            budget = self._cost.profile.max_num_batched_tokens - len(decoding)
            chunks: list[tuple[SimSeq, int]] = []
            for seq in ready:
                if seq.prefill_left > 0 and budget > 0:
                    take = min(seq.prefill_left, budget)
                    chunks.append((seq, take))
                    budget -= take
            if chunks:
                await self._mixed_step(decoding, chunks)
            else:
                await self._decode_steps(decoding)
            self._finish_done()

    def _by_class(self, ready: list[SimSeq]) -> list[SimSeq]:
        """The ready sequences that take the next iteration: those rule 5 does not hold."""
        return [s for s in ready if s.ticket is None or not s.ticket.held]

    def _leave(self, seq: SimSeq) -> None:
        """The sequence left the steps (finished or aborted): rule 5 decides again."""
        if seq.ticket is not None:
            self.holds.leave(seq.ticket)

    async def _mixed_step(self, decoding: list[SimSeq], chunks: list[tuple[SimSeq, int]]) -> None:
        prefill = [PrefillChunk(take, seq.context) for seq, take in chunks]
        dt = self._cost.step_time_s(prefill, sum(s.context for s in decoding), len(decoding))
        dt += self._shape_s(sum(c.tokens for c in prefill) + len(decoding))
        start = self._clock.now()
        for seq, _ in chunks:
            if seq.scheduled_s is None:
                seq.scheduled_s = start
        self.busy_s += dt  # the GPU's work: co-residents' steps stretch, the work does not
        await self._clock.sleep(self._step_s(dt))
        self.steps += 1
        now = self._clock.now()
        for seq in decoding:
            self._emit(seq, 1, now)
        for seq, take in chunks:
            seq.prefill_left -= take
            seq.context += take
            if seq.prefill_left == 0:
                self._emit(seq, 1, now)

    async def _decode_steps(self, decoding: list[SimSeq]) -> None:
        """Run decode steps until the first sequence finishes or a new one is ready."""
        k = min(s.output_left for s in decoding)
        if any(s.deltas is not None for s in decoding):
            k = min(k, STREAM_STEPS)
        n = len(decoding)
        context = sum(s.context for s in decoding)
        ends: list[float] = []
        work: list[float] = []
        total = done = 0.0
        for i in range(k):
            step = self._cost.decode_step_time_s(n, context + i * n)
            if i == 0:
                step += self._shape_s(n)
            done += step
            work.append(done)
            total += self._step_s(step)
            ends.append(total)
        start = self._clock.now()
        woken = await self._clock.wait_event(self._wake, total)
        done_steps = k
        if woken:
            elapsed = self._clock.now() - start
            done_steps = min(k, bisect.bisect_right(ends, elapsed) + 1)
            await self._clock.sleep(ends[done_steps - 1] - elapsed)
        self.busy_s += work[done_steps - 1]
        self.steps += done_steps
        now = self._clock.now()
        for seq in decoding:
            self._emit(seq, done_steps, now)

    def _emit(self, seq: SimSeq, tokens: int, now: float) -> None:
        if seq.aborted:  # aborted while the step that produced these tokens ran
            return
        streaming = seq.deltas is not None and seq.reply is not None
        if seq.first_token_s is None:
            seq.first_token_s = now
            if streaming:
                assert seq.reply is not None
                seq.first_delta = seq.reply.take(1)
            seq.first.set_result(now)
            if tokens > 1 and seq.deltas is not None:
                delta = seq.reply.take(tokens - 1) if streaming and seq.reply else None
                seq.deltas.put_nowait(TokenDelta(now, tokens - 1, delta))
        elif seq.deltas is not None:
            delta = seq.reply.take(tokens) if streaming and seq.reply else None
            seq.deltas.put_nowait(TokenDelta(now, tokens, delta))
        seq.context += tokens if seq.output_done else tokens - 1
        seq.output_done += tokens
        seq.output_left -= tokens
        if seq.ticket is not None:
            seq.ticket.context_tokens = seq.context + seq.prefill_left

    def _finish_done(self) -> None:
        finished = [s for s in self.seqs if s.ready and s.output_left <= 0]
        if not finished:
            return
        self.seqs = [s for s in self.seqs if not (s.ready and s.output_left <= 0)]
        now = self._clock.now()
        if not self.seqs:
            self._idle_since = now
        for seq in finished:
            self._leave(seq)
            request = seq.admission.request
            self._kv.release(request, seq.output_done, now, self.runs(request.session_key))
            assert seq.first_token_s is not None
            assert seq.queued_s is not None and seq.scheduled_s is not None
            seq.done.set_result(
                call_result(
                    seq.admission,
                    self._node,
                    output_tokens=seq.output_done,
                    first_token_s=seq.first_token_s,
                    finished_s=now,
                    output=seq.reply.output if seq.reply is not None else None,
                    restored_bytes=seq.restored_bytes,
                    recomputed_tokens=seq.recomputed_tokens,
                    engine=EngineTimes(seq.queued_s, seq.scheduled_s, seq.first_token_s, now),
                )
            )
