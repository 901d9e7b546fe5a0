"""``VLLMEngine``: the ``Engine`` seam over one vLLM ``AsyncLLM`` (the package docstring,
runtime/engines/vllm/__init__.py, says how the GPU and CPU paths differ)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from talaria.core.calls import (
    DEFAULT_SAMPLING,
    Call,
    FinishReason,
    ModelOutput,
    OutputAccumulator,
    OutputDelta,
)
from talaria.core.clock import Clock
from talaria.core.types import (
    CallRejected,
    CallRequest,
    EngineTimes,
    Finished,
    FirstToken,
    GenerationEvent,
    KvSource,
    TokenDelta,
)
from talaria.runtime.costmodel import CostModel
from talaria.runtime.engine import Admission, EngineInfo, EngineSnapshot, call_result
from talaria.runtime.engines.vllm.adapter import (
    PRIORITY_DEFAULT,
    PRIORITY_SP,
    AsyncLLMLike,
    RealVllmApi,
    VllmApi,
    aclose,
    config_int,
    engine_times,
    no_shutdown,
)
from talaria.runtime.engines.vllm.chat import (
    ChatTotals,
    VllmChat,
    decoding_params,
    to_vllm_request,
)
from talaria.runtime.engines.vllm.kv import KvShape, SessionMemory
from talaria.runtime.engines.vllm.switching import WEIGHTS, SleepStates
from talaria.runtime.tokenizer import IncrementalDecoder, Tokenizer


def _finish(reason: str) -> FinishReason:
    if reason == "tool_calls":
        return "tool_calls"
    return "length" if reason == "length" else "stop"


def _context_error(exc: CallRejected) -> CallRejected:
    """vLLM's "maximum context length" refusal as OpenAI's ``context_length_exceeded``."""
    if "context length" in str(exc).lower():
        return CallRejected("context_length_exceeded", str(exc), "messages")
    return exc


def _token_sampling(request: CallRequest) -> dict[str, Any]:
    """The caller's sampling parameters that apply to a call sent as token ids (no stop strings
    or logprobs there: the engine decodes itself; chat calls get every parameter)."""
    return decoding_params(request.call.sampling if request.call is not None else DEFAULT_SAMPLING)


PROMPT_MEMO = 256
"""Tokenized prompts kept between ``estimate_service_s`` / ``try_admit`` and ``run``."""


@dataclass(frozen=True)
class RateModel:
    """Per-token timing of one engine, for ``estimate_service_s`` (SP budgets), the switch and
    restore estimates in status, and routing. Linear on purpose; the defaults are rough figures
    for the tiny models on a 2-core CPU (a 300-token prefill ≈ 30 ms, a decode step ≈ 4-6 ms)
    and are to be replaced by measured values per model and node (`talaria calibrate`).

    - service = uncached prompt tokens × ``prefill_s_per_token``
      (+ restored tokens × ``kv_restore_s_per_token`` when the prefix comes from host)
      + expected output tokens × (``decode_step_s`` + running calls × ``decode_step_s_per_seq``);
    - switch in = ``wake_s`` (weights + KV pool) or, once staged, ``kv_wake_s``; 0 on the CPU
      path (a gate).
    """

    prefill_s_per_token: float = 1e-4
    decode_step_s: float = 5e-3
    decode_step_s_per_seq: float = 2e-4
    wake_s: float = 0.0
    kv_wake_s: float = 0.0
    kv_restore_s_per_token: float = 0.0


@dataclass(frozen=True)
class VLLMEngineOptions:
    """How a ``VLLMEngine`` behaves around its ``AsyncLLM``."""

    sleep_mode: bool
    """GPU path (sleep / wake at switches) if True; CPU gate if False."""
    max_model_len: int = 2048
    ignore_eos: bool = True
    """Generate exactly ``max_output_tokens`` (replay semantics; right for random weights)."""
    rates: RateModel = field(default_factory=RateModel)
    host_kv_survives_sleep: bool = False
    """A KV connector's host tier keeps session KV across ``sleep`` (LMCache; not the native
    OffloadingConnector in vLLM 0.32.0, whose tier is reset on sleep)."""
    weight_bytes_per_device: float | None = None
    """Bytes of weights each GPU holds when awake (staging needs that much free)."""
    device_bytes: float | None = None
    """Memory of one of the engine's GPUs (GPU path). Awake, the engine holds
    ``memory_share × device_bytes`` of each: its weights and its KV pool."""
    memory_share: float = 0.9
    """The engine's ``gpu_memory_utilization`` (vLLM's default 0.9): its split of each GPU.
    Engines whose shares sum to at most 1 can be awake together (co-residency)."""
    free_device_bytes: Callable[[], float] | None = None
    """Free memory now on the engine's fullest GPU; without it (or the weight bytes) staging
    is off."""
    sampling: Mapping[str, Any] = field(default_factory=dict)
    """Extra ``SamplingParams`` fields (e.g. ``temperature=0``)."""
    cost: CostModel | None = None
    """A calibrated cost model of this engine (its profile has a ``StepFit`` for the model):
    if given, service and recompute estimates come from it instead of ``rates``, exactly as
    the simulator estimates them."""
    chat: ChatOptions | None = None
    """Serve chat calls through vLLM's OpenAI serving layer (chat.py): for a model with a
    Hugging Face tokenizer. None: the byte tokenizer's own template (the tiny test models)."""


@dataclass(frozen=True)
class ChatOptions:
    """How vLLM's serving layer treats this model's chat calls (``vllm serve``'s flags)."""

    model_path: str
    tool_parser: str | None = None
    """``--tool-call-parser`` (auto tool choice is on when set)."""
    reasoning_parser: str | None = None
    """``--reasoning-parser``."""
    tool_strict_level: str = "auto"
    """``--tool-strict-level``: ``auto`` (a tool's own ``strict``), ``function`` or
    ``parameter`` (every tool's arguments held to its schema)."""
    chat_template: str | None = None
    """``--chat-template`` (a file or the template itself); None: the model's own."""


class VLLMEngine:
    """One model's vLLM ``AsyncLLM`` behind the ``Engine`` protocol (see the module docstring).

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
        self._node = node
        self._kv = kv_shape
        self._tok = tokenizer
        self._opt = options
        self._rates = options.rates
        self._api: VllmApi = api if api is not None else RealVllmApi()
        self._llm: AsyncLLMLike | None = None
        self._states = SleepStates(
            clock,
            weight_bytes_per_device=options.weight_bytes_per_device,
            free_device_bytes=options.free_device_bytes,
        )
        self._active = False
        self._running = 0
        self._generating = 0
        self._busy_since = 0.0
        self.busy_s = 0.0
        self.switches = 0
        self.last_keep_kv_on_host: bool | None = None
        self._ids = itertools.count()
        self._memory = SessionMemory(kv_shape.block_tokens, options.host_kv_survives_sleep)
        self._prompts: OrderedDict[str, list[int]] = OrderedDict()
        self._chat: VllmChat | None = None

    @property
    def epoch(self) -> int:
        """Sleeps so far: KV in the device prefix cache is from the current epoch only."""
        return self._states.epoch

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def sleep_mode(self) -> bool:
        return self._opt.sleep_mode

    @property
    def started(self) -> bool:
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
            )
        if self._opt.sleep_mode:
            await self._states.put_to_sleep_after_start(llm)
        self._active = False

    async def shutdown(self) -> None:
        """Stop the ``AsyncLLM``: its EngineCore process exits. vLLM's ``shutdown`` is
        synchronous (~5 s on the CPU backend): it runs in a worker thread, so the loop keeps
        serving the node's other engines meanwhile."""
        await self._states.stop()
        llm, self._llm = self._llm, None
        self._active = False
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
    def active(self) -> bool:
        return self._active

    @property
    def running(self) -> int:
        return self._running

    @property
    def staging(self) -> bool:
        return self._states.staged and not self._active

    @property
    def awake_tags(self) -> frozenset[str]:
        """What vLLM holds on the device now (GPU path): ``weights`` and/or ``kv_cache``."""
        return self._states.awake

    def snapshot(self) -> EngineSnapshot:
        staged = 1.0 if self.staging and WEIGHTS in self._states.awake else 0.0
        busy = self.busy_s
        if self._generating:
            busy += self._clock.now() - self._busy_since
        return EngineSnapshot(self.model, self._active, self._running, staged, busy)

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

    def kv_floor_bytes(self) -> float:
        return 0.0  # its KV pool is inside its share (sized at start)

    def can_activate(self) -> bool:
        """True: its share of each GPU is free once the leaving engines slept (the scheduler
        only co-resides engines whose shares fit)."""
        return True

    def kv_bytes(self, tokens: int) -> float:
        return self._kv.kv_bytes(tokens)

    def needed_bytes(self, request: CallRequest) -> float:
        """0: vLLM manages its own KV pool (preempting when full), so the node never refuses a
        call for memory on its behalf."""
        return 0.0

    def switch_in_s(self) -> float:
        if self._active or not self._opt.sleep_mode:
            return 0.0
        if self.staging and WEIGHTS in self._states.awake:
            return self._rates.kv_wake_s
        return self._rates.wake_s

    def kv_restore_s(self, tokens: int) -> float:
        return tokens * self._rates.kv_restore_s_per_token

    def recompute_s(self, tokens: int) -> float:
        if self._opt.cost is not None:
            return self._opt.cost.recompute_time_s(tokens)
        return tokens * self._rates.prefill_s_per_token

    def estimate_service_s(self, request: CallRequest, expected_output_tokens: int) -> float:
        try:
            ids = self._prompt_ids(request)
            source, cached = self._memory.predict(request, ids, self.epoch)
            prompt = len(ids)
        except Exception:  # a prompt that cannot be tokenized fails in run, not here
            source, cached, prompt = KvSource.NEW, 0, request.prompt_tokens
        cost = self._opt.cost
        if cost is not None:
            t = cost.call_overhead_s() + cost.prefill_time_s(prompt - cached, cached)
            if source is KvSource.HOST:
                t += self.kv_restore_s(cached)
            batch = self._running + 1
            return t + cost.decode_time_s(expected_output_tokens, prompt, batch)
        r = self._rates
        t = (prompt - cached) * r.prefill_s_per_token
        if source is KvSource.HOST:
            t += cached * r.kv_restore_s_per_token
        step = r.decode_step_s + self._running * r.decode_step_s_per_seq
        return t + expected_output_tokens * step

    # -- prompts and prefix prediction -----------------------------------------------------
    def _prompt_ids(self, request: CallRequest) -> list[int]:
        """The call's prompt ids (memoised per request): ``messages`` through the chat
        template, else its text ``prompt``, else synthetic ids of length ``prompt_tokens``."""
        ids = self._prompts.get(request.request_id)
        if ids is not None:
            return ids
        call = request.call
        if call is not None and call.messages is not None:
            tools = [t.to_openai() for t in call.tools] or None
            ids = self._tok.encode_chat(call.messages, tools, call.template_kwargs)
        elif call is not None and call.prompt is not None:
            ids = self._tok.encode(call.prompt)
        else:
            ids = self._memory.synthetic_ids(request)
        self._prompts[request.request_id] = ids
        while len(self._prompts) > PROMPT_MEMO:
            self._prompts.popitem(last=False)
        return ids

    # -- admission and generation ----------------------------------------------------------
    def try_admit(
        self, request: CallRequest, arrival_s: float, sp_admitted: bool
    ) -> Admission | None:
        """Admit whenever active (vLLM owns the KV memory)."""
        if not self._active:
            raise RuntimeError(f"engine {self.model} is not active")
        try:
            source, cached = self._memory.predict(request, self._prompt_ids(request), self.epoch)
        except Exception:  # reported by run, where the call fails
            source, cached = KvSource.NEW, 0
        self._running += 1
        return Admission(request, arrival_s, self._clock.now(), sp_admitted, source, cached)

    async def run(self, admission: Admission) -> AsyncIterator[GenerationEvent]:
        """Generate the call: ``FirstToken`` (with vLLM's cached-token count and the first
        token's text), ``TokenDelta``s for streaming calls, then ``Finished``."""
        events = self._generate(admission)
        try:
            async for event in events:
                yield event
        finally:
            self._running -= 1
            await events.aclose()

    async def _generate(self, admission: Admission) -> AsyncGenerator[GenerationEvent, None]:
        call = admission.request.call
        if self._chat is not None and call is not None and call.messages is not None:
            async for event in self._generate_chat(admission, call, self._chat):
                yield event
            return
        request = admission.request
        llm = self._engine()
        ids = self._prompt_ids(request)
        self._prompts.pop(request.request_id, None)
        room = self._opt.max_model_len - len(ids)
        if room < 1:
            raise CallRejected(
                "context_length_exceeded",
                f"This model's maximum context length is {self._opt.max_model_len} tokens. "
                f"However, your prompt is {len(ids)} tokens ({self.model}).",
                param="messages" if call is not None and call.messages is not None else "prompt",
            )
        known = request.output_tokens  # a replayed reply: exactly that many tokens
        params = self._api.sampling_params(
            max_tokens=max(1, min(known or request.max_output_tokens, room)),
            ignore_eos=self._opt.ignore_eos or known is not None,
            **{**self._opt.sampling, **_token_sampling(request)},
        )
        priority = PRIORITY_SP if admission.sp_admitted else PRIORITY_DEFAULT
        request_id = f"{request.request_id}#{next(self._ids)}"
        decoder = IncrementalDecoder(self._tok)
        out_ids: list[int] = []
        cached = 0
        first_s: float | None = None
        source = admission.kv_source
        finished = False
        finish_reason: FinishReason = "stop"
        metrics: Any = None
        self._begin_busy()
        stream = llm.generate(
            self._api.tokens_prompt(ids), params, request_id=request_id, priority=priority
        )
        try:
            async for out in stream:
                num_cached = getattr(out, "num_cached_tokens", None)
                if num_cached is not None:
                    cached = int(num_cached)
                metrics = getattr(out, "metrics", None) or metrics
                outputs = getattr(out, "outputs", None) or ()
                new = [int(t) for t in outputs[0].token_ids] if outputs else []
                finished = bool(getattr(out, "finished", False))
                if finished and outputs and getattr(outputs[0], "finish_reason", None) == "length":
                    finish_reason = "length"
                if not new and not finished:
                    continue
                now = self._clock.now()
                out_ids.extend(new)
                rest = new
                if first_s is None and new:
                    first_s = now
                    source = self._memory.classify(request, cached, self.epoch)
                    text = decoder.push(new[:1])
                    rest = new[1:]
                    if finished and not rest:
                        text += decoder.finish()
                    yield FirstToken(now, cached, source, OutputDelta(text=text))
                if rest or (finished and first_s is not None):
                    text = decoder.push(rest) if rest else ""
                    if finished:
                        text += decoder.finish()
                    if request.stream and (rest or text):
                        yield TokenDelta(now, len(rest), OutputDelta(text=text))
            # (no break at ``finished``: vLLM's stream then ends by itself, nothing to abort)
        finally:
            self._end_busy()
            if not finished:
                await aclose(stream)
        if first_s is None:
            raise RuntimeError(f"{self.model}: request {request_id} ended without output")
        yield self._finished(
            admission,
            ids,
            out_ids,
            cached,
            source,
            first_s,
            ModelOutput(text=decoder.text, finish_reason=finish_reason),
            engine=engine_times(metrics, self._api.engine_now(), self._clock.now()),
        )

    async def _generate_chat(
        self, admission: Admission, call: Call, chat: VllmChat
    ) -> AsyncGenerator[GenerationEvent, None]:
        """A chat call through vLLM's serving layer (chat.py): its deltas as vLLM streams
        them; the prompt ids and cached tokens it reports go to the session's KV record."""
        request = admission.request
        self._prompts.pop(request.request_id, None)
        body = to_vllm_request(
            call,
            model=self.model,
            request_id=f"{request.request_id}#{next(self._ids)}",
            priority=PRIORITY_SP if admission.sp_admitted else PRIORITY_DEFAULT,
            max_tokens=request.output_tokens or request.max_output_tokens,
            cache_salt=request.cache_salt,
        )
        try:
            vllm_request = chat.request(body)
        except CallRejected as exc:
            raise _context_error(exc) from exc
        totals = ChatTotals()
        output = OutputAccumulator()
        out_ids: list[int] = []
        first_s: float | None = None
        finish: FinishReason = "stop"
        self._begin_busy()
        try:
            async for chunk in chat.stream(vllm_request, totals):
                if chunk.finish_reason is not None:
                    finish = _finish(chunk.finish_reason)
                if not chunk.token_ids and chunk.delta.empty:
                    continue
                now = self._clock.now()
                out_ids.extend(chunk.token_ids)
                output.add(chunk.delta)
                if first_s is None:
                    first_s = now
                    cached, source = admission.cached_tokens, admission.kv_source
                    yield FirstToken(now, cached, source, chunk.delta)
                elif request.stream:
                    yield TokenDelta(now, len(chunk.token_ids), chunk.delta)
        except CallRejected as exc:
            raise _context_error(exc) from exc
        finally:
            self._end_busy()
        if first_s is None:
            raise RuntimeError(f"{self.model}: request {request.request_id} ended without output")
        ids, cached = totals.prompt_token_ids, totals.cached_tokens
        yield self._finished(
            admission,
            ids,
            out_ids,
            cached,
            self._memory.classify(request, cached, self.epoch),
            first_s,
            output.output(finish),
            prompt_tokens=totals.prompt_tokens,
            output_tokens=totals.completion_tokens,
        )

    def _finished(
        self,
        admission: Admission,
        ids: list[int],
        out_ids: list[int],
        cached: int,
        source: KvSource,
        first_s: float,
        output: ModelOutput,
        *,
        prompt_tokens: int | None = None,
        output_tokens: int | None = None,
        engine: EngineTimes | None = None,
    ) -> Finished:
        """The call's result; its prompt and output ids become the session's KV record.
        Token counts default to the ids' lengths (vLLM's own counts when it reports them);
        ``engine``: vLLM's own timestamps of the call, where it gave them."""
        request = admission.request
        recomputed = self._memory.recomputed(request, ids) if source is KvSource.RECOMPUTE else 0
        self._memory.remember(request.session_id, ids + out_ids, self.epoch)
        return Finished(
            call_result(
                admission,
                self._node,
                prompt_tokens=prompt_tokens or len(ids),
                cached_tokens=cached,
                output_tokens=output_tokens or len(out_ids),
                first_token_s=first_s,
                finished_s=self._clock.now(),
                kv_source=source,
                restored_bytes=self._kv.kv_bytes(cached) if source is KvSource.HOST else 0.0,
                recomputed_tokens=recomputed,
                output=output,
                engine=engine,
            )
        )

    def _begin_busy(self) -> None:
        if self._generating == 0:
            self._busy_since = self._clock.now()
        self._generating += 1

    def _end_busy(self) -> None:
        self._generating -= 1
        if self._generating == 0:
            self.busy_s += self._clock.now() - self._busy_since

    # -- switching -------------------------------------------------------------------------
    async def activate(self) -> float:
        """Open the engine for admission. GPU path: wake whatever is asleep (``wake_up()``, or
        only ``kv_cache`` after staging). CPU path: a gate, ~0 s."""
        start = self._clock.now()
        llm = self._engine()
        if self._opt.sleep_mode:
            await self._states.activate(llm)
        self._active = True
        self.switches += 1
        return self._clock.now() - start

    async def deactivate(self, keep_kv_on_host: bool, keep_host_weight_copy: bool) -> float:
        """Close the engine; it must have drained (the scheduler waits for running calls).
        GPU path: ``sleep(level=1)`` (weights to pinned host memory, always kept there, so
        ``keep_host_weight_copy`` changes nothing; KV discarded — a host tier keeps sessions
        only if ``host_kv_survives_sleep``). CPU path: a gate, ~0 s; KV stays resident."""
        if self._running:
            raise RuntimeError(f"deactivating {self.model} with {self._running} calls running")
        start = self._clock.now()
        self._active = False
        self.last_keep_kv_on_host = keep_kv_on_host
        if self._opt.sleep_mode:
            await self._states.deactivate(self._engine())
        return self._clock.now() - start

    def start_staging(self) -> bool:
        """GPU path: wake the weights ahead of the switch if they fit in free device memory
        now. False on the CPU path (nothing to stage) and when it does not fit."""
        if not self._opt.sleep_mode or self._llm is None or self._active:
            return False
        return self._states.start_staging(self._llm)

    def cancel_staging(self) -> None:
        """Stop staging; weights already woken go back to sleep (in the background)."""
        if self._llm is not None:
            self._states.cancel_staging(self._llm, self._active)
