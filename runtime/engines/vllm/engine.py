"""``VLLMEngine``: the ``Engine`` seam over one vLLM ``AsyncLLM`` (the package docstring,
runtime/engines/vllm/__init__.py, says how the GPU and CPU paths differ).

This module holds the engine's lifecycle, state, estimates, admission and switches; serving an
admitted call (prompt ids, generation, the result) is generate.py's and chat_generate.py's, its
options options.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import replace

from talaria.core.clock import Clock
from talaria.core.types import CallRequest, GenerationEvent, KvSource
from talaria.runtime.engine import Admission, ClassStepRule, EngineInfo
from talaria.runtime.engines.class_holds import ClassHolds
from talaria.runtime.engines.serving import ServedEngine, ServingState
from talaria.runtime.engines.tokenizer import Tokenizer
from talaria.runtime.engines.vllm.adapter import (
    AsyncLLMLike,
    RealVllmApi,
    VllmApi,
    config_int,
    no_shutdown,
)
from talaria.runtime.engines.vllm.chat import VllmChat
from talaria.runtime.engines.vllm.generate import VllmGenerator
from talaria.runtime.engines.vllm.kv import KvShape, SessionMemory
from talaria.runtime.engines.vllm.options import VLLMEngineOptions
from talaria.runtime.engines.vllm.prompts import PromptIds
from talaria.runtime.engines.vllm.switching import WEIGHTS, SleepStates


class VLLMEngine(ServedEngine):
    """One model's vLLM ``AsyncLLM`` behind the ``Engine`` protocol, with its ``Switching``,
    ``Staging``, ``KvTiming``, ``OwnKv`` and ``StepsByClass`` capabilities (see the module
    docstring; its memory is vLLM's own, not the node's).

    ``engine_factory`` returns the ``AsyncLLM``, or an awaitable of it (``build_vllm_engine``'s
    builds it in a worker thread: it takes ~20 s on a CPU). ``await start()`` before use,
    ``await shutdown()`` at the end.
    """

    def __init__(
        self,
        name: str,
        engine_factory: Callable[[], AsyncLLMLike | Awaitable[AsyncLLMLike]],
        clock: Clock,
        node: str,
        *,
        kv_shape: KvShape,
        tokenizer: Tokenizer,
        options: VLLMEngineOptions,
        api: VllmApi | None = None,
    ) -> None:
        self.model = name
        self._factory = engine_factory
        self._clock = clock
        self._kv = kv_shape
        self._opt = options
        self._rates = options.rates
        self._api: VllmApi = api if api is not None else RealVllmApi()
        self._llm: AsyncLLMLike | None = None
        self._states = SleepStates(
            clock,
            weight_bytes_per_device=options.weight_bytes_per_device,
            free_device_bytes=options.free_device_bytes,
            level=options.sleep_level,
        )
        self._state = ServingState(name, clock)
        self.last_keep_kv_on_host: bool | None = None
        self._memory = SessionMemory(kv_shape.block_tokens, options.host_kv_survives_sleep)
        self._prompts = PromptIds(tokenizer, self._memory)
        self._holds = ClassHolds(self.decode_step_s)
        self._generator = VllmGenerator(
            name,
            clock,
            node,
            self._api,
            tokenizer,
            options,
            self._memory,
            self._states,
            self._prompts,
            self._state.busy,
            self._holds,
        )
        self._chat: VllmChat | None = None

    def step_by_class(self, rule: ClassStepRule | None) -> None:
        """The fair queue's rule 5 (``StepsByClass``), by pausing whole calls for a higher
        class's (class_holds.py): calls sent as token ids are aborted and resubmitted with
        their output; calls through vLLM's chat serving layer wait before they start, and
        those whose text can be continued are aborted and resumed (chat_generate.py ``chat``)."""
        self._holds.rule = rule
        self._holds.decide()

    @property
    def preemptions(self) -> int:
        """Times a running call was paused for a higher class."""
        return self._holds.preemptions

    @property
    def epoch(self) -> int:
        """Sleeps so far: KV in the device prefix cache is from the current epoch only."""
        return self._states.epoch

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def sleep_mode(self) -> bool:
        """GPU path (sleep / wake at switches) rather than the CPU gate."""
        return self._opt.sleep_mode

    @property
    def started(self) -> bool:
        """Its ``AsyncLLM`` is built (``start``) and not shut down."""
        return self._llm is not None

    async def start(self) -> None:
        """Build the ``AsyncLLM`` (``build_vllm_engine``'s factory does it in a worker thread,
        so the loop keeps running) and, on the GPU path, put it to sleep so that the next
        engine's start finds its memory free. Start a node's engines one at a time."""
        if self._llm is not None:
            return
        made = self._factory()
        llm = await made if inspect.isawaitable(made) else made
        self._llm = llm
        block = config_int(llm, "cache_config", "block_size")
        if block is not None and block != self._kv.block_tokens:
            self._kv = replace(self._kv, block_tokens=block)  # vLLM's choice (128 on CPU)
            self._memory.block_tokens = block
        chat = self._opt.chat
        if chat is not None:
            self._chat = await VllmChat.build(
                llm,
                self.model,
                chat.model_path,
                tool_parser=chat.tool_parser,
                reasoning_parser=chat.reasoning_parser,
                tool_strict_level=chat.tool_strict_level,
                chat_template=chat.chat_template,
                special_tokens=chat.special_tokens,
            )
        if self._opt.sleep_mode:
            await self._states.put_to_sleep_after_start(llm)
        self._state.active = False

    async def shutdown(self) -> None:
        """Stop the ``AsyncLLM``: its EngineCore process exits. vLLM's ``shutdown`` is
        synchronous (~5 s on the CPU backend): it runs in a worker thread, so the loop keeps
        serving the node's other engines meanwhile."""
        await self._states.stop()
        llm, self._llm = self._llm, None
        self._state.active = False
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)
            # vLLM 0.32.0's AsyncLLM.__del__ shuts down again; when the object lives until
            # interpreter exit (its constructing thread's frames can keep it), that second
            # shutdown fails on torn-down module globals and prints a TypeError. Once is enough.
            with contextlib.suppress(AttributeError, TypeError):
                llm.shutdown = no_shutdown  # type: ignore[method-assign]

    def _engine(self) -> AsyncLLMLike:
        if self._llm is None:
            raise RuntimeError(f"engine {self.model} is not started")
        return self._llm

    # -- state -----------------------------------------------------------------------------
    @property
    def staging(self) -> bool:
        """Staging is wanted while the engine is not active (GPU path)."""
        return self._states.staged and not self._state.active

    @property
    def awake_tags(self) -> frozenset[str]:
        """What vLLM holds on the device now (GPU path): ``weights`` and/or ``kv_cache``."""
        return self._states.awake

    @property
    def staged_fraction(self) -> float:
        """1 once the weights are awake ahead of a switch, else 0."""
        return 1.0 if self.staging and WEIGHTS in self._states.awake else 0.0

    def info(self) -> EngineInfo:
        """The block size vLLM chose and its ``max_num_batched_tokens`` (None before start or
        from an engine without a ``vllm_config``)."""
        return EngineInfo(
            "vllm",
            self._opt.sleep_mode,
            self._kv.block_tokens,
            config_int(self._llm, "scheduler_config", "max_num_batched_tokens"),
            self._opt.max_model_len,
        )

    def session_kv(self) -> dict[str, tuple[int, KvSource]]:
        """Best-effort view of the sessions whose KV this engine probably still holds, for
        status and KV-locality routing (vLLM's KV does not live in ``NodeMemory``): session →
        (tokens of its last prompt + output, ``HBM`` if no sleep since, else ``HOST`` when a
        host tier survives sleep). Sessions whose KV a sleep dropped are left out; so is
        eviction inside vLLM, which the engine does not see."""
        return self._memory.held(self.epoch)

    # -- estimates -------------------------------------------------------------------------
    @property
    def device_bytes(self) -> float | None:
        """Memory of one of its GPUs on the GPU path (None: CPU gate, or unknown)."""
        return self._opt.device_bytes if self._opt.sleep_mode else None

    @property
    def weight_bytes(self) -> float:
        """What it holds of each GPU awake, for co-residency: ``memory_share × device_bytes``
        (weights and KV pool; a vLLM node's capacity is one GPU's memory). 0 on the CPU gate,
        where every engine stays resident and the gate is logical."""
        if self.device_bytes is None:
            return 0.0
        return self._opt.memory_share * self.device_bytes

    @property
    def kv_shape(self) -> KvShape:
        """Its KV layout, from the model's config (the block size vLLM chose, once started).
        Its KV pool is inside its memory share, sized at start and managed by vLLM
        (preempting when full): the node's byte accounting does not see it."""
        return self._kv

    def switch_in_s(self) -> float:
        """0 when active or on the CPU gate; ``kv_wake_s`` once the weights are staged; else
        ``wake_s`` (``RateModel``)."""
        if self._state.active or not self._opt.sleep_mode:
            return 0.0
        if self.staging and WEIGHTS in self._states.awake:
            return self._rates.kv_wake_s
        return self._rates.wake_s

    def kv_restore_s(self, tokens: int) -> float:
        """``tokens × kv_restore_s_per_token`` (``RateModel``)."""
        return self._rates.restore_s(tokens)

    def recompute_s(self, tokens: int) -> float:
        """The calibrated cost model's recompute time, else ``tokens × prefill_s_per_token``."""
        if self._opt.cost is not None:
            return self._opt.cost.recompute_time_s(tokens)
        return self._rates.prefill_s(tokens)

    def estimate_service_s(self, request: CallRequest, expected_output_tokens: int) -> float:
        """From the calibrated cost model as the simulator estimates, else ``RateModel``'s
        formula, with the prefix the engine predicts it still holds."""
        try:
            ids = self._prompts.get(request)
            source, cached = self._memory.predict(request, ids, self.epoch)
            prompt = len(ids)
        except Exception:  # a prompt that cannot be tokenized fails in run, not here
            source, cached, prompt = KvSource.NEW, 0, request.prompt_tokens
        cost = self._opt.cost
        if cost is not None:
            t = cost.call_overhead_s() + cost.prefill_time_s(prompt - cached, cached)
            if source is KvSource.HOST:
                t += self.kv_restore_s(cached)
            batch = self._state.running + 1
            return t + cost.decode_time_s(expected_output_tokens, prompt, batch)
        r = self._rates
        t = (prompt - cached) * r.prefill_s_per_token
        if source is KvSource.HOST:
            t += cached * r.kv_restore_s_per_token
        return t + expected_output_tokens * r.decode_step(self._state.running + 1)

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """The calibrated cost model's decode step, else ``RateModel``'s
        ``decode_step_s + (batch − 1) × decode_step_s_per_seq``."""
        cost = self._opt.cost
        if cost is not None:
            return cost.decode_step_time_s(batch, context_tokens)
        return self._rates.decode_step(batch)

    # -- admission and generation ----------------------------------------------------------
    def try_admit(
        self, request: CallRequest, arrival_s: float, sp_admitted: bool
    ) -> Admission | None:
        """Admit whenever active (vLLM owns the KV memory), with the prefix it predicts."""
        try:
            source, cached = self._memory.predict(request, self._prompts.get(request), self.epoch)
        except Exception:  # reported by run, where the call fails
            source, cached = KvSource.NEW, 0
        return self._state.admit(request, arrival_s, sp_admitted, source, cached)

    def run(self, admission: Admission) -> AsyncIterator[GenerationEvent]:
        """Generate the call: ``FirstToken`` (with vLLM's cached-token count and the first
        token's text), ``TokenDelta``s for streaming calls, then ``Finished``."""
        return self._state.serve(self._generate(admission))

    async def _generate(self, admission: Admission) -> AsyncGenerator[GenerationEvent, None]:
        call = admission.request.call
        if self._chat is not None and call is not None and call.messages is not None:
            async for event in self._generator.chat(admission, call, self._chat, self._kv):
                yield event
            return
        tokens = self._generator.tokens(admission, self._engine(), self._kv)
        async with contextlib.aclosing(tokens) as events:
            async for event in events:
                yield event

    # -- switching -------------------------------------------------------------------------
    async def activate(self) -> float:
        """Open the engine for admission. GPU path: wake whatever is asleep (``wake_up()``, or
        only ``kv_cache`` after staging). CPU path: a gate, ~0 s."""
        start = self._clock.now()
        llm = self._engine()
        if self._opt.sleep_mode:
            await self._states.activate(llm)
        self._state.open()
        return self._clock.now() - start

    async def deactivate(self, keep_kv_on_host: bool, keep_host_weight_copy: bool) -> float:
        """Close the engine; it must have drained (the scheduler waits for running calls).
        GPU path: ``sleep(level)`` (level 1: weights to pinned host memory, always kept
        there, so ``keep_host_weight_copy`` changes nothing; level 2: weights discarded, the
        wake reloads them; KV discarded — a host tier keeps sessions only if
        ``host_kv_survives_sleep``). CPU path: a gate, ~0 s; KV stays resident."""
        self._state.close()
        start = self._clock.now()
        self.last_keep_kv_on_host = keep_kv_on_host
        if self._opt.sleep_mode:
            await self._states.deactivate(self._engine())
        return self._clock.now() - start

    def start_staging(self) -> bool:
        """GPU path: wake the weights ahead of the switch if they fit in free device memory
        now. False on the CPU path (nothing to stage) and when it does not fit."""
        if not self._opt.sleep_mode or self._llm is None or self._state.active:
            return False
        return self._states.start_staging(self._llm)

    def cancel_staging(self) -> None:
        """Stop staging; weights already woken go back to sleep (in the background)."""
        if self._llm is not None:
            self._states.cancel_staging(self._llm, self._state.active)
