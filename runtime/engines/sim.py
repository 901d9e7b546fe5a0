"""``SimEngine``: one model's simulated executor on a node, timed by the cost model.

The engine is three parts: this module (admission, estimates, the model's switches: wake,
sleep, weight staging), the iteration loop (sim_steps.py: continuous batching with chunked
prefill, vLLM V1 style) and the KV accounting (sim_kv.py: prefix reuse, LRU eviction to host
DRAM, memory committed at admission) in the node's ``NodeMemory``, which every simulated engine
of the node shares.

Output: a replayed trace entry generates exactly its recorded ``output_tokens``; a live call
gets a reply written by ``sim_reply.plan_reply`` (text, a harmless tool call, reasoning) whose
length is the number of tokens generated, handed out by ``ReplyStream`` as decoding advances.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from talaria.core.clock import Clock
from talaria.core.model_spec import ModelSpec
from talaria.core.types import CallRequest, GenerationEvent, KvSource
from talaria.core.weight_tiers import WeightTier
from talaria.runtime.costmodel import CostModel
from talaria.runtime.engine import Admission, ClassStepRule, EngineInfo
from talaria.runtime.engines.sim_kv import SimKv
from talaria.runtime.engines.sim_reply import DEFAULT_REPLIES, ReplyPolicy, ReplyStream, plan_reply
from talaria.runtime.engines.sim_steps import SimSeq, StepLoop
from talaria.runtime.memory.resources import DeviceShare, NodeMemory, PcieLink

STAGING_CHUNKS = 16
"""Weight staging moves in this many chunks, so KV transfers can pass between them."""


class SimEngine:
    """One model's simulated engine on a node (the ``Engine`` protocol, and its ``Switching``,
    ``Staging``, ``MemoryAccounting`` and ``KvTiming`` capabilities): ``model``'s weights
    and its sessions' KV live in the node's shared ``memory``; KV and weight moves queue on
    the node's ``pcie`` link; steps are timed by ``cost`` and stretched by the node's other
    busy engines (``device``). ``host_kv``: evicted KV goes to host DRAM instead of being
    dropped; ``class_eviction``: idle KV is evicted lowest class first (``fair_queue``).
    ``replies``: what live calls are answered (sim_reply.py). ``node``: the node's name, for
    the results."""

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
        class_eviction: bool = False,
    ) -> None:
        self.model = model.name
        self._replies = replies
        self._spec = model
        self._cost = cost
        self._memory = memory
        self._pcie = pcie
        self._clock = clock
        self._kv = SimKv(model.name, cost, memory, host_kv, class_eviction)
        self._steps = StepLoop(
            model.name, cost, self._kv, pcie, clock, node, device or DeviceShare()
        )
        self._active = False
        self._staging_task: asyncio.Task[None] | None = None
        self._staged_bytes_done = 0.0
        self._recompute_cache: dict[int, float] = {}
        self.loads: dict[str, int] = {}
        """Its weights' loads into HBM (wakes and stagings), by the tier read from."""

    def step_by_class(self, rule: ClassStepRule | None) -> None:
        """Rule 5 of the fair queue for this engine's iterations (``StepsByClass``)."""
        self._steps.holds.rule = rule

    @property
    def preemptions(self) -> int:
        """Times a running call was held out of the steps for a higher class."""
        return self._steps.preemptions

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Nothing to load: the simulated engine is its cost model."""

    async def shutdown(self) -> None:
        """Nothing to release."""

    # -- state -----------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Its weights are in HBM and it admits calls."""
        return self._active

    @property
    def running(self) -> int:
        """Calls admitted and not yet finished."""
        return len(self._steps.seqs)

    @property
    def busy_s(self) -> float:
        """The GPU's work so far: the sum of its steps' times (unstretched by co-residents)."""
        return self._steps.busy_s

    @property
    def staging(self) -> bool:
        """Its weights are being copied into HBM ahead of a switch (``start_staging``)."""
        return self.model in self._memory.staged

    @property
    def staged_fraction(self) -> float:
        """The share of the weights staging has copied in (0 when not staging)."""
        return self._staged_bytes_done / self._spec.weight_bytes if self.staging else 0.0

    @property
    def weight_bytes(self) -> float:
        """The model's weights (catalog)."""
        return self._spec.weight_bytes

    @property
    def weight_tier(self) -> WeightTier:
        """Where its weights are read from when it wakes: a pinned host copy, else the node's
        NVMe (runtime/memory/host_weights.py)."""
        copy = self._memory.host_weights.has_copy(self.model)
        return WeightTier.HOST if copy else WeightTier.NVME

    def _read_s(self, nbytes: float | None = None) -> float:
        """Reading its weights (or ``nbytes`` of them) into HBM from ``weight_tier``: host DRAM
        at the calibrated wake rate (runtime/costmodel.py), NVMe at the loader's."""
        if self.weight_tier is WeightTier.HOST:
            return self._cost.weight_stage_time_s(nbytes)
        return self._cost.weight_read_time_s(WeightTier.NVME, nbytes)

    def _loaded_from(self, tier: WeightTier) -> None:
        self.loads[tier.value] = self.loads.get(tier.value, 0) + 1

    def kv_floor_bytes(self) -> float:
        """KV of one sequence of the model's whole context window (vLLM refuses to start with
        less room than that, docs/sources.md §4)."""
        return self._cost.kv_bytes(self._spec.context_window_tokens)

    def can_activate(self) -> bool:
        """The weights fit in HBM once idle KV is evicted (staged weights are already in)."""
        if self._active or self.staging:
            return True
        short = self._spec.weight_bytes - self._memory.hbm_free_bytes()
        return self._kv.idle_hbm_bytes(short) >= short

    # -- admission -------------------------------------------------------------------------
    def info(self) -> EngineInfo:
        """``sim``, switches that cost, and the profile's block size and token budget."""
        p = self._cost.profile
        return EngineInfo(
            "sim", True, p.block_tokens, p.max_num_batched_tokens, self._spec.context_window_tokens
        )

    def kv_bytes(self, tokens: int) -> float:
        """The cost model's KV bytes of ``tokens`` tokens."""
        return self._cost.kv_bytes(tokens)

    def switch_in_s(self) -> float:
        """0 when active; the rest of staging + the device copy when staging; else a wake."""
        if self._active:
            return 0.0
        if self.staging:
            remaining = self._spec.weight_bytes - self._staged_bytes_done
            return self._read_s(remaining) + self._cost.d2d_switch_time_s()
        return self._read_s()

    def kv_restore_s(self, tokens: int) -> float:
        """The PCIe transfer of ``tokens`` tokens' KV."""
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
        """KV of prompt + max output, less what the session holds in HBM (sim_kv.py)."""
        return self._kv.needed_bytes(request)

    def estimate_service_s(self, request: CallRequest, expected_output_tokens: int) -> float:
        """Intake + prefill of the uncached prompt (+ the host restore) + the decode steps at
        the batch it would join."""
        source, cached, _ = self._kv.reuse(request)
        t = self._cost.call_overhead_s()
        t += self._cost.prefill_time_s(request.prompt_tokens - cached, cached)
        if source is KvSource.HOST:
            t += self._cost.kv_transfer_time_s(self._cost.kv_bytes(cached))
        batch = self.running + 1
        context = sum(s.context for s in self._steps.seqs) + request.prompt_tokens
        return t + expected_output_tokens * self._cost.decode_step_time_s(batch, context)

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """The cost model's decode step (runtime/costmodel.py ``decode_step_time_s``)."""
        return self._cost.decode_step_time_s(batch, context_tokens)

    def try_admit(
        self, request: CallRequest, arrival_s: float, sp_admitted: bool
    ) -> Admission | None:
        """Plan the reply of a live call, evict idle KV for the call's room, commit it, and
        hand the sequence to the step loop; None if it does not fit."""
        if not self._active:
            raise RuntimeError(f"engine {self.model} is not active")
        # First, so that a reply it cannot write (CallRejected: a schema past the builder's
        # budget, core/schema_instance.py) refuses the call before anything changed.
        reply = ReplyStream(*plan_reply(request, self._replies)) if _writes_reply(request) else None
        source, cached, entry = self._kv.reuse(request)
        offloaded = self._kv.evict_for(
            self.needed_bytes(request), request.session_key, request.parent_session_key
        )
        if offloaded is None:
            return None
        now = self._clock.now()
        self._kv.commit(request, entry, now, self._steps.runs(request.session_key))
        admission = Admission(request, arrival_s, now, sp_admitted, source, cached)
        self._memory.host_weights.observe(self.model, now)
        idle = self._steps.idle_s(now)
        shared = request.shared_prefix_tokens or request.parent_prefix_tokens
        if request.output_tokens is not None:
            output_tokens = request.output_tokens
        elif reply is not None:
            output_tokens = reply.tokens
        else:
            output_tokens = request.max_output_tokens
        seq = SimSeq(
            admission,
            prefill_left=request.prompt_tokens - cached,
            context=cached,
            output_left=output_tokens,
            restored_bytes=self._cost.kv_bytes(cached) if source is KvSource.HOST else 0.0,
            recomputed_tokens=shared if source is KvSource.RECOMPUTE else 0,
            deltas=asyncio.Queue() if request.stream else None,
            reply=reply,
        )
        self._steps.add(seq, offloaded + seq.restored_bytes, self._cost.call_overhead_s(idle))
        return admission

    def run(self, admission: Admission) -> AsyncIterator[GenerationEvent]:
        """The admitted call's events, as the step loop produces them."""
        return self._steps.events(admission)

    # -- switching -------------------------------------------------------------------------
    async def activate(self) -> float:
        """Make the model servable. Staged weights: pay what staging has not yet moved, then
        the device-to-device copy; otherwise a full wake (its weights read from
        ``weight_tier``: host→HBM at the sleep-mode rate, or NVMe→HBM)."""
        start = self._clock.now()
        self._loaded_from(self.weight_tier)
        weights = self._spec.weight_bytes
        offloaded = 0.0 if self.staging else self._kv.evict_for(weights)
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
                await self._pcie.transfer(self._read_s(remaining), remaining, priority=0)
            await self._clock.sleep(self._cost.d2d_switch_time_s())
            self._memory.load_weights(self.model, weights)
        else:
            await self._pcie.transfer(self._read_s(), weights, priority=0)
        self._staged_bytes_done = 0.0
        self._active = True
        return self._clock.now() - start

    async def deactivate(self, keep_kv_on_host: bool, keep_host_weight_copy: bool) -> float:
        """Put the model to sleep. Session KV goes to host DRAM (most recent first, while room
        lasts) or is dropped; weights are copied to host (vLLM sleep level 1) unless a pinned
        host copy is kept, in which case they are simply released. A model whose weights are
        only on NVMe gets a host copy if its expected demand earns one (the sleep's copy),
        else its weights are discarded (sleep level 2)."""
        if self._steps.seqs:
            raise RuntimeError(f"deactivating {self.model} with {self.running} calls running")
        start = self._clock.now()
        self._active = False
        moved = self._kv.put_away(keep_kv_on_host)
        if moved:
            await self._pcie.transfer(self._cost.kv_transfer_time_s(moved), moved, priority=0)
        on_nvme = not self._memory.host_weights.has_copy(self.model)
        copied = on_nvme and self._memory.keep_host_copy(self.model, self._clock.now())
        if (not keep_host_weight_copy and not on_nvme) or copied:
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
            await self._pcie.transfer(self._read_s(chunk), chunk, priority=1)
            self._staged_bytes_done += chunk

    def _stop_staging_task(self) -> None:
        if self._staging_task is not None:
            self._staging_task.cancel()
            self._staging_task = None

    def cancel_staging(self) -> None:
        """Stop staging and give back the HBM it claimed."""
        self._stop_staging_task()
        self._memory.unstage(self.model)
        self._staged_bytes_done = 0.0


def _writes_reply(request: CallRequest) -> bool:
    """Whether the engine writes the reply's content: a live call whose length is not given,
    or is the limit because it asked to go past its end (``ignore_eos``; the text is the
    answer, the tokens count to the limit); a replayed trace entry has its length and no
    content."""
    if not request.live:
        return False
    return request.output_tokens is None or (
        request.call is not None and request.call.sampling.ignore_eos
    )
