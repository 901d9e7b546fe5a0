"""SimEngine: one model's continuous-batching executor, timed by the cost model.

Each iteration (vLLM V1 style, chunked prefill on) takes every running sequence: decoding ones
add one token each, then prefilling ones take chunks of the remaining token budget
(``max_num_batched_tokens``) in admission order. The iteration lasts
``CostModel.step_time_s``. A step that completes a sequence's prefill also samples its first
token. When every running sequence is decoding, the engine jumps ahead to the first finish in
one sleep (the steps are summed exactly), and is interrupted at the next step boundary if a new
sequence becomes ready meanwhile.

Output: a replayed trace entry generates exactly its recorded ``output_tokens``; a live call
gets a reply written by ``sim_reply.plan_reply`` (text, a harmless tool call, reasoning) whose
length is the number of tokens generated, handed out by ``ReplyStream`` as decoding advances.

Prefix reuse per session: prefix in HBM is skipped; in host DRAM it is restored over PCIe
(priority over weight staging) before the sequence runs; gone, it is prefilled again. Memory is
committed at admission for prompt + max output tokens; idle KV is evicted LRU to make room
(to host DRAM when ``host_kv``, else dropped).
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from talaria.core.calls import OutputDelta
from talaria.core.catalog import ModelSpec
from talaria.core.clock import Clock
from talaria.core.types import (
    CallRequest,
    CallResult,
    EngineTimes,
    Finished,
    FirstToken,
    GenerationEvent,
    KvSource,
    TokenDelta,
)
from talaria.runtime.costmodel import CostModel, PrefillChunk
from talaria.runtime.engine import Admission, EngineInfo, EngineSnapshot, call_result
from talaria.runtime.engines.sim_reply import DEFAULT_REPLIES, ReplyPolicy, ReplyStream, plan_reply
from talaria.runtime.scheduling.resources import (
    DeviceShare,
    KvLocation,
    NodeMemory,
    PcieLink,
    SessionKv,
)

STAGING_CHUNKS = 16
"""Weight staging moves in this many chunks, so KV transfers can pass between them."""

STREAM_STEPS = 8
"""While a streaming call decodes, the engine wakes at least every this many steps to hand
out its new tokens (a replay without streaming callers jumps straight to the next finish)."""


@dataclass(eq=False)
class _Seq:
    admission: Admission
    prefill_left: int
    context: int
    output_left: int
    restored_bytes: float
    recomputed_tokens: int
    ready: bool = False
    output_done: int = 0
    first_token_s: float | None = None
    queued_s: float | None = None
    """When it became ready (intake and KV moves done) to join a step."""
    scheduled_s: float | None = None
    """When the first step that took a chunk of it began."""
    first: asyncio.Future[float] = field(default_factory=lambda: _loop().create_future())
    done: asyncio.Future[CallResult] = field(default_factory=lambda: _loop().create_future())
    deltas: asyncio.Queue[TokenDelta] | None = None
    reply: ReplyStream | None = None
    first_delta: OutputDelta | None = None


def _loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


class SimEngine:
    def __init__(
        self,
        model: ModelSpec,
        cost: CostModel,
        memory: NodeMemory,
        pcie: PcieLink,
        clock: Clock,
        node: str,
        host_kv: bool,
        replies: ReplyPolicy = DEFAULT_REPLIES,
        device: DeviceShare | None = None,
    ) -> None:
        self.model = model.name
        self._device = device or DeviceShare()
        self._replies = replies
        self._spec = model
        self._cost = cost
        self._memory = memory
        self._pcie = pcie
        self._clock = clock
        self._node = node
        self._host_kv = host_kv
        self._block = cost.profile.block_tokens
        self._active = False
        self._seqs: list[_Seq] = []
        self._by_id: dict[str, _Seq] = {}
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._staging_task: asyncio.Task[None] | None = None
        self._staged_bytes_done = 0.0
        self.busy_s = 0.0
        self.steps = 0
        self._recompute_cache: dict[int, float] = {}
        self._idle_since = -math.inf
        """When the engine last ran out of work (−inf: never ran)."""
        self._step_shapes: set[int] = set()
        """Token counts of the steps run so far (``_shape_s``)."""

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Nothing to load: the simulated engine is its cost model."""

    async def shutdown(self) -> None:
        """Nothing to release."""

    # -- state -----------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._active

    @property
    def running(self) -> int:
        return len(self._seqs)

    @property
    def staging(self) -> bool:
        return self.model in self._memory.staged

    def snapshot(self) -> EngineSnapshot:
        weights = self._spec.weight_bytes
        staged = self._staged_bytes_done / weights if self.staging else 0.0
        return EngineSnapshot(self.model, self._active, self.running, staged, self.busy_s)

    @property
    def weight_bytes(self) -> float:
        return self._spec.weight_bytes

    def kv_floor_bytes(self) -> float:
        """KV of one sequence of the model's whole context window (vLLM refuses to start with
        less room than that, docs/sources.md §4)."""
        return self._cost.kv_bytes(self._spec.context_window_tokens)

    def can_activate(self) -> bool:
        """The weights fit in HBM once idle KV is evicted (staged weights are already in)."""
        if self._active or self.staging:
            return True
        idle = sum(e.nbytes for e in self._memory.lru(KvLocation.HBM))
        return self._memory.hbm_free_bytes() + idle >= self._spec.weight_bytes

    def _step_s(self, step_s: float) -> float:
        """The step's time with the other busy engines of the node (``DeviceShare``, α from
        the profile); the roofline's fixed step overhead is host time; a fitted step is
        measured whole, and its α was measured whole too."""
        profile = self._cost.profile
        host = profile.step_overhead_s if self._cost.fit is None else 0.0
        return self._device.stretch(self.model, step_s, host, profile.coresident_interference)

    def _shape_s(self, tokens: int) -> float:
        """The cost model's ``new_shape_s`` the first time the engine runs a step of ``tokens``
        tokens, 0 after (the engine keeps what it built for that shape)."""
        if tokens in self._step_shapes:
            return 0.0
        self._step_shapes.add(tokens)
        return self._cost.new_shape_s()

    # -- admission -------------------------------------------------------------------------
    def session_kv(self) -> dict[str, tuple[int, KvSource]]:
        """Nothing: this engine's KV lives in the node's ``NodeMemory``."""
        return {}

    def info(self) -> EngineInfo:
        p = self._cost.profile
        return EngineInfo(
            "sim", True, p.block_tokens, p.max_num_batched_tokens, self._spec.context_window_tokens
        )

    def _reuse(self, request: CallRequest) -> tuple[KvSource, int, SessionKv | None]:
        """Where the call's prefix comes from and how many tokens of it are reused: only whole
        blocks, and never the last prompt token (vLLM recomputes it to get logits)."""
        entry = self._memory.kv.get(request.session_id)
        if entry is not None and entry.model != self.model:
            entry = None
        shared = request.shared_prefix_tokens
        if shared is None:
            shared = entry.tokens if entry is not None else 0
        if entry is None:
            source = KvSource.NEW if shared == 0 else KvSource.RECOMPUTE
            return source, 0, None
        reusable = min(shared, entry.tokens, request.prompt_tokens - 1)
        reusable -= reusable % self._block
        if reusable <= 0:
            return (KvSource.NEW if shared == 0 else KvSource.RECOMPUTE), 0, entry
        source = KvSource.HBM if entry.location is KvLocation.HBM else KvSource.HOST
        return source, reusable, entry

    def kv_bytes(self, tokens: int) -> float:
        return self._cost.kv_bytes(tokens)

    def switch_in_s(self) -> float:
        if self._active:
            return 0.0
        if self.staging:
            remaining = self._spec.weight_bytes - self._staged_bytes_done
            return self._cost.weight_stage_time_s(remaining) + self._cost.d2d_switch_time_s()
        return self._cost.weight_wake_time_s()

    def kv_restore_s(self, tokens: int) -> float:
        return self._cost.kv_transfer_time_s(self._cost.kv_bytes(tokens))

    def recompute_s(self, tokens: int) -> float:
        """Memoised: a session's KV size stays put between its calls, and status snapshots ask
        for every session on every routing decision."""
        cached = self._recompute_cache.get(tokens)
        if cached is None:
            if len(self._recompute_cache) > 65_536:
                self._recompute_cache.clear()
            cached = self._recompute_cache[tokens] = self._cost.recompute_time_s(tokens)
        return cached

    def needed_bytes(self, request: CallRequest) -> float:
        _, _, entry = self._reuse(request)
        total = self._cost.kv_bytes(request.prompt_tokens + request.max_output_tokens)
        held = entry.nbytes if entry is not None and entry.location is KvLocation.HBM else 0.0
        return max(0.0, total - held)

    def estimate_service_s(self, request: CallRequest, expected_output_tokens: int) -> float:
        source, cached, _ = self._reuse(request)
        t = self._cost.call_overhead_s()
        t += self._cost.prefill_time_s(request.prompt_tokens - cached, cached)
        if source is KvSource.HOST:
            t += self._cost.kv_transfer_time_s(self._cost.kv_bytes(cached))
        batch = self.running + 1
        context = sum(s.context for s in self._seqs) + request.prompt_tokens
        return t + expected_output_tokens * self._cost.decode_step_time_s(batch, context)

    def _evict_for(self, need: float, keep: str) -> float | None:
        """Free HBM for ``need`` bytes by evicting idle KV LRU; returns the bytes offloaded to
        host (a PCIe transfer the admitted call waits for), or None if it cannot fit."""
        victims = [e for e in self._memory.lru(KvLocation.HBM) if e.session_id != keep]
        if self._memory.hbm_free_bytes() + sum(v.nbytes for v in victims) < need:
            return None
        offloaded = 0.0
        for victim in victims:
            if self._memory.hbm_free_bytes() >= need:
                break
            if self._host_kv and self._make_host_room(victim.nbytes):
                self._memory.move(victim.session_id, KvLocation.HOST)
                offloaded += victim.nbytes
            else:
                self._memory.drop(victim.session_id)
        return offloaded

    def _make_host_room(self, nbytes: float) -> bool:
        if nbytes > self._memory.host_kv_capacity_bytes:
            return False
        for old in self._memory.lru(KvLocation.HOST):
            if self._memory.host_free_bytes() >= nbytes:
                break
            self._memory.drop(old.session_id)
        return self._memory.host_free_bytes() >= nbytes

    def try_admit(
        self, request: CallRequest, arrival_s: float, sp_admitted: bool
    ) -> Admission | None:
        if not self._active:
            raise RuntimeError(f"engine {self.model} is not active")
        # First, so that a reply it cannot write (CallRejected: a schema past the builder's
        # budget, core/schema_instance.py) refuses the call before anything changed.
        reply = ReplyStream(*plan_reply(request, self._replies)) if _writes_reply(request) else None
        source, cached, entry = self._reuse(request)
        offloaded = self._evict_for(self.needed_bytes(request), keep=request.session_id)
        if offloaded is None:
            return None
        now = self._clock.now()
        total_tokens = request.prompt_tokens + request.max_output_tokens
        pins = entry.pins if entry is not None else 0
        self._memory.put(
            SessionKv(
                request.session_id,
                self.model,
                total_tokens,
                self._cost.kv_bytes(total_tokens),
                KvLocation.HBM,
                now,
                pins + 1,
            )
        )
        admission = Admission(request, arrival_s, now, sp_admitted, source, cached)
        idle = 0.0 if self._seqs else now - self._idle_since
        shared = request.shared_prefix_tokens or 0
        if request.output_tokens is not None:
            output_tokens = request.output_tokens
        elif reply is not None:
            output_tokens = reply.tokens
        else:
            output_tokens = request.max_output_tokens
        seq = _Seq(
            admission,
            prefill_left=request.prompt_tokens - cached,
            context=cached,
            output_left=output_tokens,
            restored_bytes=self._cost.kv_bytes(cached) if source is KvSource.HOST else 0.0,
            recomputed_tokens=shared if source is KvSource.RECOMPUTE else 0,
            deltas=asyncio.Queue() if request.stream else None,
            reply=reply,
        )
        self._seqs.append(seq)
        self._by_id[request.request_id] = seq
        transfer = offloaded + seq.restored_bytes
        intake = self._cost.call_overhead_s(idle)
        if transfer > 0 or intake > 0:
            asyncio.get_running_loop().create_task(self._ready_later(seq, transfer, intake))
        else:
            self._set_ready(seq)
        return admission

    async def _ready_later(self, seq: _Seq, nbytes: float, intake_s: float) -> None:
        """Ready once its KV has moved (``nbytes`` over PCIe) and ``intake_s`` has passed since
        admission, whichever is later (the two overlap)."""
        start = self._clock.now()
        if nbytes > 0:
            await self._pcie.transfer(self._cost.kv_transfer_time_s(nbytes), nbytes, priority=0)
        left = intake_s - (self._clock.now() - start)
        if left > 0:
            await self._clock.sleep(left)
        self._set_ready(seq)

    def _set_ready(self, seq: _Seq) -> None:
        seq.ready = True
        seq.queued_s = self._clock.now()
        self._wake.set()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._serve())

    async def run(self, admission: Admission) -> AsyncIterator[GenerationEvent]:
        seq = self._by_id[admission.request.request_id]
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
        self._by_id.pop(admission.request.request_id, None)
        yield Finished(result)

    # -- the iteration loop ----------------------------------------------------------------
    async def _serve(self) -> None:
        try:
            await self._serve_ready()
        finally:
            self._device.set_busy(self.model, False, self._wake)

    async def _serve_ready(self) -> None:
        while True:
            ready = [s for s in self._seqs if s.ready]
            if not ready:
                return
            self._device.set_busy(self.model, True, self._wake)
            self._wake.clear()
            decoding = [s for s in ready if s.prefill_left == 0]
            budget = self._cost.profile.max_num_batched_tokens - len(decoding)
            chunks: list[tuple[_Seq, int]] = []
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

    async def _mixed_step(self, decoding: list[_Seq], chunks: list[tuple[_Seq, int]]) -> None:
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

    async def _decode_steps(self, decoding: list[_Seq]) -> None:
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

    def _emit(self, seq: _Seq, tokens: int, now: float) -> None:
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

    def _finish_done(self) -> None:
        finished = [s for s in self._seqs if s.ready and s.output_left <= 0]
        if not finished:
            return
        self._seqs = [s for s in self._seqs if not (s.ready and s.output_left <= 0)]
        now = self._clock.now()
        if not self._seqs:
            self._idle_since = now
        for seq in finished:
            request = seq.admission.request
            tokens = request.prompt_tokens + seq.output_done
            self._memory.resize(request.session_id, tokens, self._cost.kv_bytes(tokens))
            entry = self._memory.kv[request.session_id]
            entry.pins -= 1
            entry.last_used_s = now
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

    # -- switching -------------------------------------------------------------------------
    async def activate(self) -> float:
        """Make the model servable. Staged weights: pay what staging has not yet moved, then
        the device-to-device copy; otherwise a full wake (host→HBM at the sleep-mode rate)."""
        start = self._clock.now()
        weights = self._spec.weight_bytes
        offloaded = 0.0 if self.staging else self._evict_for(weights, keep="")
        if offloaded is None:
            raise RuntimeError(f"no HBM room for {self.model}'s weights (check can_activate)")
        if not self.staging:
            self._memory.load_weights(self.model, weights)  # claimed before any await
        if offloaded:
            await self._pcie.transfer(self._cost.kv_transfer_time_s(offloaded), offloaded, 0)
        if self.staging:
            remaining = weights - self._staged_bytes_done
            self._stop_staging_task()
            if remaining > 0:
                seconds = self._cost.weight_stage_time_s(remaining)
                await self._pcie.transfer(seconds, remaining, priority=0)
            await self._clock.sleep(self._cost.d2d_switch_time_s())
            self._memory.load_weights(self.model, weights)
        else:
            await self._pcie.transfer(self._cost.weight_wake_time_s(), weights, priority=0)
        self._staged_bytes_done = 0.0
        self._active = True
        return self._clock.now() - start

    async def deactivate(self, keep_kv_on_host: bool, keep_host_weight_copy: bool) -> float:
        """Put the model to sleep. Session KV goes to host DRAM (most recent first, while room
        lasts) or is dropped; weights are copied to host (vLLM sleep level 1) unless a pinned
        host copy is kept, in which case they are simply released."""
        if self._seqs:
            raise RuntimeError(f"deactivating {self.model} with {len(self._seqs)} calls running")
        start = self._clock.now()
        self._active = False
        mine = [
            e
            for e in self._memory.kv.values()
            if e.model == self.model and e.location is KvLocation.HBM
        ]
        mine.sort(key=lambda e: (-e.last_used_s, e.session_id))
        moved = 0.0
        for entry in mine:
            if keep_kv_on_host and self._make_host_room(entry.nbytes):
                self._memory.move(entry.session_id, KvLocation.HOST)
                moved += entry.nbytes
            else:
                self._memory.drop(entry.session_id)
        if moved:
            await self._pcie.transfer(self._cost.kv_transfer_time_s(moved), moved, priority=0)
        if not keep_host_weight_copy:
            weights = self._spec.weight_bytes
            await self._pcie.transfer(self._cost.weight_sleep_time_s(), weights, priority=0)
        self._memory.unload_weights(self.model)
        return self._clock.now() - start

    def start_staging(self) -> bool:
        """Claim HBM for the weights and copy them in chunks at low PCIe priority."""
        weights = self._spec.weight_bytes
        if self._active or self.staging or self._memory.hbm_free_bytes() < weights:
            return False
        self._memory.stage(self.model, weights)
        self._staged_bytes_done = 0.0
        self._staging_task = asyncio.get_running_loop().create_task(self._stage(weights))
        return True

    async def _stage(self, weights: float) -> None:
        chunk = weights / STAGING_CHUNKS
        for _ in range(STAGING_CHUNKS):
            await self._pcie.transfer(self._cost.weight_stage_time_s(chunk), chunk, priority=1)
            self._staged_bytes_done += chunk

    def _stop_staging_task(self) -> None:
        if self._staging_task is not None:
            self._staging_task.cancel()
            self._staging_task = None

    def cancel_staging(self) -> None:
        self._stop_staging_task()
        self._memory.unstage(self.model)
        self._staged_bytes_done = 0.0


def _writes_reply(request: CallRequest) -> bool:
    """Whether the engine writes the reply's content: a live call whose length is not given
    (a replayed trace entry has its length and no content)."""
    return request.output_tokens is None and request.live
