"""VLLMEngine: the ``Engine`` seam over one vLLM ``AsyncLLM`` (V1; its EngineCore runs in a
process of its own).

vLLM is imported lazily, only by ``build_vllm_engine``'s factory and the default ``VllmApi``:
this module imports without vLLM, and tests pass a fake engine (``engine_factory``) and a fake
``api``. Two paths, chosen once at construction (``sleep_mode``):

**GPU path (sleep mode).** The engine is built with ``enable_sleep_mode=True``,
``enable_prefix_caching=True`` and ``scheduling_policy="priority"``, and put to sleep right
after it starts (``start``), so the next engine's start finds the memory free (vLLM checks free
memory at start: start engines one at a time, awaiting each ``start``).

- ``deactivate``: only with nothing running (the scheduler drains first; checked), then
  ``sleep(level=1)``: weights are copied to pinned host memory, the KV cache is discarded.
  Level 1 always keeps the host copy, so ``keep_host_weight_copy`` changes nothing here.
- ``activate``: ``wake_up()`` — weights *and* ``kv_cache`` (waking only the weights leaves
  vLLM paused: the pitfall of docs/sources.md §5). After staging, only
  ``wake_up(tags=["kv_cache"])``.
- ``start_staging``: if the weights fit in the free device memory now (``free_device_bytes``
  ≥ ``weight_bytes_per_device``), ``wake_up(tags=["weights"])`` in the background; vLLM stays
  paused until ``kv_cache`` is woken too. ``cancel_staging`` puts the weights back to sleep.
  All wake/sleep calls are serialised; each converges the engine on the wanted state.
- Host KV: vLLM's KV offloading (``kv_offloading_size`` + ``kv_offloading_backend``, the
  OffloadingConnector) writes prompt blocks to a host tier that a later call with the same
  prefix reloads. In vLLM 0.32.0 (read in its source, not run on a GPU here)
  ``sleep(level>=1)`` ends in ``reset_prefix_cache(reset_running_requests=True,
  reset_connector=True)``: the *native* backend's ``reset_cache`` evicts its whole CPU tier,
  so session KV does not survive a switch; the LMCache connectors do not implement
  ``reset_cache`` (a no-op), so an LMCache store survives. ``host_kv_survives_sleep`` tells
  the engine which holds (``build_vllm_engine`` sets it for ``kv_offloading_backend="lmcache"``).
  ``keep_kv_on_host`` cannot change what vLLM does at sleep; it is recorded only.

**CPU path (no sleep mode).** vLLM's CPU backend has no sleep mode, so every engine stays
resident and switching is a logical gate: ``activate`` / ``deactivate`` open and close it and
take ~0 s. This does not measure switch cost; the scheduler's decisions (slots, admission, SP
budgets) are the same as on a GPU. KV stays in each engine's CPU KV cache across switches, so a
returning session finds its prefix cached (reported as ``KvSource.HBM``).

**Cached tokens and ``KvSource``.** vLLM reports ``RequestOutput.num_cached_tokens`` (local
prefix-cache hits + tokens loaded by a KV connector, not told apart). The engine counts its
sleeps (``epoch``): cached tokens > 0 in the same epoch as the session's previous call are
``HBM``; after a sleep they can only have come from a host tier (``HOST``); none are ``NEW``
for a session's first call and ``RECOMPUTE`` afterwards.

``session_kv()`` is the engine's best-effort view of which sessions' KV it still holds (vLLM's
KV is not in ``NodeMemory``); the node's status lists those of its live sessions, so the
proxy's KV-locality routing sees them.

**Memory.** vLLM owns its KV memory (a block pool sized at start by
``gpu_memory_utilization``) and preempts when it runs out, so ``try_admit`` admits whenever the
engine is active and ``needed_bytes`` is 0. ``kv_bytes`` is still exact (from the model
config), for reservations and status.

**Timing estimates** come from the calibrated ``CostModel`` when the node's profile has a fit
for the model (``talaria calibrate``; the simulator then estimates exactly as the live engine
does), else from ``RateModel``, a per-token rate model with rough defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import os
import zlib
from array import array
from collections import OrderedDict
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from talaria.core.calls import FinishReason, ModelOutput, OutputDelta
from talaria.core.clock import Clock
from talaria.core.types import (
    CallRejected,
    CallRequest,
    CallResult,
    Finished,
    FirstToken,
    GenerationEvent,
    KvSource,
    TokenDelta,
)
from talaria.runtime.costmodel import CostModel
from talaria.runtime.engine import Admission, EngineInfo, EngineSnapshot
from talaria.runtime.tokenizer import (
    BOS_ID,
    BYTE_OFFSET,
    TEXT_IDS,
    ByteTokenizer,
    IncrementalDecoder,
    Tokenizer,
    load_tokenizer,
)

WEIGHTS = "weights"
KV_CACHE = "kv_cache"
ALL_TAGS = frozenset({WEIGHTS, KV_CACHE})

PRIORITY_SP = 0
"""vLLM priority of an SP-admitted call (lower runs first under ``scheduling_policy="priority"``):
it was admitted on a time budget that ends at the slot deadline."""
PRIORITY_DEFAULT = 1

SESSION_MEMORY = 1024
"""Sessions whose last context (prompt + output ids, 4 bytes a token) the engine remembers, LRU."""
PROMPT_MEMO = 256
"""Tokenized prompts kept between ``estimate_service_s`` / ``try_admit`` and ``run``."""
PROBE_INTERVAL_S = 1.0
"""How long a free-device-memory reading stays good for staging decisions."""

_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8": 1,
    "fp8": 1,
}


# -- vLLM boundary ------------------------------------------------------------------------------
class AsyncLLMLike(Protocol):
    """The part of ``vllm.v1.engine.async_llm.AsyncLLM`` the engine uses."""

    def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, *, priority: int = 0
    ) -> AsyncIterator[Any]: ...

    async def sleep(self, level: int = 1) -> None: ...

    async def wake_up(self, tags: list[str] | None = None) -> Any: ...

    async def abort(self, request_id: str) -> None: ...

    def shutdown(self) -> None: ...


class VllmApi(Protocol):
    """Builds vLLM's request objects (a fake in tests)."""

    def tokens_prompt(self, ids: list[int]) -> Any: ...

    def sampling_params(self, *, max_tokens: int, ignore_eos: bool, **extra: Any) -> Any: ...


class RealVllmApi:
    """``TokensPrompt`` and ``SamplingParams`` from vLLM (imported on first use). Outputs come
    as deltas (``RequestOutputKind.DELTA``) and are not detokenized by vLLM
    (``detokenize=False``): the engine decodes with its own tokenizer."""

    def tokens_prompt(self, ids: list[int]) -> Any:
        from vllm.inputs import TokensPrompt

        return TokensPrompt(prompt_token_ids=ids)

    def sampling_params(self, *, max_tokens: int, ignore_eos: bool, **extra: Any) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            max_tokens=max_tokens,
            ignore_eos=ignore_eos,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
            **extra,
        )


def sleep_mode_available() -> bool:
    """Whether vLLM's current platform has sleep mode (CUDA / ROCm / XPU); False without vLLM
    and on the CPU backend."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return bool(current_platform.is_sleep_mode_available())


# -- models and rates ---------------------------------------------------------------------------
@dataclass(frozen=True)
class KvShape:
    """The KV footprint of one token, from the model config.

    Bytes per token on the node = 2 (K and V) × layers × physical KV heads × head_dim × dtype
    bytes; with tensor parallelism wider than the KV heads, each GPU holds a replica of one head,
    so the physical heads are ``max(kv_heads, tensor_parallel_size)``. A sequence occupies whole
    blocks of ``block_tokens``. (Standard GQA/MHA attention; MLA models differ.)
    """

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    block_tokens: int = 16
    tensor_parallel_size: int = 1

    @property
    def bytes_per_token(self) -> int:
        heads = max(self.kv_heads, self.tensor_parallel_size)
        return 2 * self.layers * heads * self.head_dim * self.dtype_bytes

    def kv_bytes(self, tokens: int) -> float:
        blocks = -(-max(0, tokens) // self.block_tokens)
        return float(blocks * self.block_tokens * self.bytes_per_token)

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any],
        *,
        block_tokens: int = 16,
        tensor_parallel_size: int = 1,
        kv_cache_dtype: str = "auto",
    ) -> KvShape:
        """From a Hugging Face ``config.json`` (its ``text_config`` for multimodal models)."""
        text = config.get("text_config")
        cfg: Mapping[str, Any] = text if isinstance(text, Mapping) else config
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        if kv_cache_dtype != "auto":
            dtype_bytes = 1 if kv_cache_dtype.startswith("fp8") else _DTYPE_BYTES[kv_cache_dtype]
        else:
            dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype"))
            dtype_bytes = _DTYPE_BYTES.get(dtype.removeprefix("torch."), 2)
        return cls(
            layers=int(cfg["num_hidden_layers"]),
            kv_heads=kv_heads,
            head_dim=head_dim,
            dtype_bytes=dtype_bytes,
            block_tokens=block_tokens,
            tensor_parallel_size=tensor_parallel_size,
        )


@dataclass(frozen=True)
class RateModel:
    """Per-token timing of one engine, for ``estimate_service_s`` (SP budgets), the switch and
    restore estimates in status, and routing. Linear on purpose; the defaults are rough figures
    for the tiny models on a 2-core CPU (a 300-token prefill ≈ 30 ms, a decode step ≈ 4-6 ms)
    and are to be replaced by measured values per model and node (issue 6).

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
    free_device_bytes: Callable[[], float] | None = None
    """Free memory now on the engine's fullest GPU; without it (or the weight bytes) staging
    is off."""
    sampling: Mapping[str, Any] = field(default_factory=dict)
    """Extra ``SamplingParams`` fields (e.g. ``temperature=0``)."""
    cost: CostModel | None = None
    """A calibrated cost model of this engine (its profile has a ``StepFit`` for the model):
    if given, service and recompute estimates come from it instead of ``rates``, exactly as
    the simulator estimates them."""


@dataclass
class _SessionState:
    context: array[int]
    """Prompt + output ids of the session's last call on this engine."""
    epoch: int
    """The engine's sleep count when that call finished."""


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (compared 256 ids at a time, as int arrays)."""
    a = a if isinstance(a, array) else array("i", a)
    b = b if isinstance(b, array) else array("i", b)
    n = min(len(a), len(b))
    i = 0
    step = 256
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _filler(seed: str, n: int) -> list[int]:
    """``n`` deterministic printable-ASCII byte ids (a-z) from ``seed`` (no global RNG)."""
    x = zlib.crc32(seed.encode()) or 1
    out = []
    for _ in range(n):
        x = (1103515245 * x + 12345) & 0x7FFFFFFF
        out.append(BYTE_OFFSET + 97 + (x >> 16) % 26)
    return out


# -- the engine ---------------------------------------------------------------------------------
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
        self._ctl = asyncio.Lock()
        self._awake: frozenset[str] = ALL_TAGS
        self._active = False
        self._want_active = False
        self._want_staged = False
        self._control_tasks: set[asyncio.Task[None]] = set()
        self._running = 0
        self._generating = 0
        self._busy_since = 0.0
        self.busy_s = 0.0
        self.epoch = 0
        """Sleeps so far: KV in the device prefix cache is from the current epoch only."""
        self.switches = 0
        self.last_keep_kv_on_host: bool | None = None
        self._ids = itertools.count()
        self._sessions: OrderedDict[str, _SessionState] = OrderedDict()
        self._probe_at: float | None = None
        self._probe_free = 0.0
        self._prompts: OrderedDict[str, list[int]] = OrderedDict()

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
        block = _config_int(llm, "cache_config", "block_size")
        if block is not None and block != self._kv.block_tokens:
            self._kv = replace(self._kv, block_tokens=block)  # vLLM's choice (128 on CPU)
        if self._opt.sleep_mode:
            await llm.sleep(level=1)
            self._awake = frozenset()
        self._active = False

    async def shutdown(self) -> None:
        """Stop the ``AsyncLLM``: its EngineCore process exits. vLLM's ``shutdown`` is
        synchronous and blocks the loop for a few seconds (~5 s on the CPU backend)."""
        for task in list(self._control_tasks):
            task.cancel()
        await asyncio.gather(*self._control_tasks, return_exceptions=True)
        llm, self._llm = self._llm, None
        self._active = False
        if llm is not None:
            llm.shutdown()
            # vLLM 0.32.0's AsyncLLM.__del__ shuts down again; when the object lives until
            # interpreter exit (its constructing thread's frames can keep it), that second
            # shutdown fails on torn-down module globals and prints a TypeError. Once is enough.
            with contextlib.suppress(AttributeError, TypeError):
                llm.shutdown = _no_shutdown  # type: ignore[method-assign]

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
        return self._want_staged and not self._active

    @property
    def awake_tags(self) -> frozenset[str]:
        """What vLLM holds on the device now (GPU path): ``weights`` and/or ``kv_cache``."""
        return self._awake

    def snapshot(self) -> EngineSnapshot:
        staged = 1.0 if self.staging and WEIGHTS in self._awake else 0.0
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
            _config_int(self._llm, "scheduler_config", "max_num_batched_tokens"),
            self._opt.max_model_len,
        )

    def session_kv(self) -> dict[str, tuple[int, KvSource]]:
        """Best-effort view of the sessions whose KV this engine probably still holds, for
        status and KV-locality routing (vLLM's KV does not live in ``NodeMemory``): session →
        (tokens of its last prompt + output, ``HBM`` if no sleep since, else ``HOST`` when a
        host tier survives sleep). Sessions whose KV a sleep dropped are left out; so is
        eviction inside vLLM, which the engine does not see."""
        out: dict[str, tuple[int, KvSource]] = {}
        for session_id, state in self._sessions.items():
            if state.epoch == self.epoch:
                out[session_id] = (len(state.context), KvSource.HBM)
            elif self._opt.host_kv_survives_sleep:
                out[session_id] = (len(state.context), KvSource.HOST)
        return out

    # -- estimates -------------------------------------------------------------------------
    def kv_bytes(self, tokens: int) -> float:
        return self._kv.kv_bytes(tokens)

    def needed_bytes(self, request: CallRequest) -> float:
        """0: vLLM manages its own KV pool (preempting when full), so the node never refuses a
        call for memory on its behalf."""
        return 0.0

    def switch_in_s(self) -> float:
        if self._active or not self._opt.sleep_mode:
            return 0.0
        if self.staging and WEIGHTS in self._awake:
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
            source, cached = self._predict(request, ids)
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
        template, else ``prompt_text``, else synthetic ids of length ``prompt_tokens``."""
        ids = self._prompts.get(request.request_id)
        if ids is not None:
            return ids
        if request.messages is not None:
            ids = self._tok.encode_chat(request.messages)
        elif request.prompt_text is not None:
            ids = self._tok.encode(request.prompt_text)
        else:
            ids = self._synthetic_ids(request)
        self._prompts[request.request_id] = ids
        while len(self._prompts) > PROMPT_MEMO:
            self._prompts.popitem(last=False)
        return ids

    def _synthetic_ids(self, request: CallRequest) -> list[int]:
        """A replayed call without text: the session's previous prompt + output (the first
        ``shared_prefix_tokens`` of it, if given), then deterministic filler, ``prompt_tokens``
        in all; so continuations share their prefix as real agent calls do."""
        n = max(1, request.prompt_tokens)
        state = self._sessions.get(request.session_id)
        base = list(state.context) if state is not None else [BOS_ID]
        keep = len(base)
        if request.shared_prefix_tokens is not None and state is not None:
            keep = min(keep, request.shared_prefix_tokens)
        ids = base[: min(keep, n)]
        seed = f"{request.session_id}/{request.call_index}/{request.request_id}"
        return ids + _filler(seed, n - len(ids))

    def _predict(self, request: CallRequest, ids: Sequence[int]) -> tuple[KvSource, int]:
        """Where the prefix will come from and how many tokens of it (whole blocks, never the
        last prompt token), judged from this engine's record of the session."""
        state = self._sessions.get(request.session_id)
        if state is None:
            known = request.call_index > 0 or bool(request.shared_prefix_tokens)
            return (KvSource.RECOMPUTE if known else KvSource.NEW), 0
        shared = min(_common_prefix(state.context, ids), len(ids) - 1)
        shared -= shared % self._kv.block_tokens
        if shared <= 0:
            return KvSource.RECOMPUTE, 0
        if state.epoch == self.epoch:
            return KvSource.HBM, shared
        if self._opt.host_kv_survives_sleep:
            return KvSource.HOST, shared
        return KvSource.RECOMPUTE, 0

    def _classify(self, request: CallRequest, cached: int) -> KvSource:
        state = self._sessions.get(request.session_id)
        if cached > 0:
            if state is not None and state.epoch != self.epoch:
                return KvSource.HOST
            return KvSource.HBM
        if state is not None or request.call_index > 0 or request.shared_prefix_tokens:
            return KvSource.RECOMPUTE
        return KvSource.NEW

    def _remember(self, session_id: str, context: list[int]) -> None:
        self._sessions[session_id] = _SessionState(array("i", context), self.epoch)
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > SESSION_MEMORY:
            self._sessions.popitem(last=False)

    # -- admission and generation ----------------------------------------------------------
    def try_admit(
        self, request: CallRequest, arrival_s: float, sp_admitted: bool
    ) -> Admission | None:
        """Admit whenever active (vLLM owns the KV memory)."""
        if not self._active:
            raise RuntimeError(f"engine {self.model} is not active")
        try:
            source, cached = self._predict(request, self._prompt_ids(request))
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
                param="messages" if request.messages is not None else "prompt",
            )
        known = request.output_tokens  # a replayed reply: exactly that many tokens
        params = self._api.sampling_params(
            max_tokens=max(1, min(known or request.max_output_tokens, room)),
            ignore_eos=self._opt.ignore_eos or known is not None,
            **dict(self._opt.sampling),
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
        self._begin_busy()
        stream = llm.generate(
            self._api.tokens_prompt(ids), params, request_id=request_id, priority=priority
        )
        try:
            async for out in stream:
                num_cached = getattr(out, "num_cached_tokens", None)
                if num_cached is not None:
                    cached = int(num_cached)
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
                    source = self._classify(request, cached)
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
                await _aclose(stream)
        if first_s is None:
            raise RuntimeError(f"{self.model}: request {request_id} ended without output")
        now = self._clock.now()
        state = self._sessions.get(request.session_id)
        recomputed = 0
        if source is KvSource.RECOMPUTE:
            if state is not None:
                recomputed = _common_prefix(state.context, ids)
            else:
                recomputed = min(request.shared_prefix_tokens or 0, len(ids))
        restored = self._kv.kv_bytes(cached) if source is KvSource.HOST else 0.0
        self._remember(request.session_id, ids + out_ids)
        yield Finished(
            CallResult(
                request_id=request.request_id,
                session_id=request.session_id,
                model=self.model,
                node=self._node,
                prompt_tokens=len(ids),
                cached_tokens=cached,
                output_tokens=len(out_ids),
                arrival_s=admission.arrival_s,
                admitted_s=admission.admitted_s,
                first_token_s=first_s,
                finished_s=now,
                kv_source=source,
                restored_bytes=restored,
                recomputed_tokens=recomputed,
                sp_admitted=admission.sp_admitted,
                output=ModelOutput(text=decoder.text, finish_reason=finish_reason),
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
        self._engine()
        if self._opt.sleep_mode:
            self._want_active = True
            self._want_staged = False
            await self._converge()
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
            self._want_active = False
            self._want_staged = False
            await self._converge()
        return self._clock.now() - start

    def start_staging(self) -> bool:
        """GPU path: wake the weights ahead of the switch if they fit in free device memory
        now. False on the CPU path (nothing to stage) and when it does not fit."""
        if not self._opt.sleep_mode or self._llm is None or self._active or self._want_staged:
            return False
        need = self._opt.weight_bytes_per_device
        if need is None or self._free_device_bytes() < need:
            return False
        self._want_staged = True
        self._spawn(self._converge())
        return True

    def _free_device_bytes(self) -> float:
        """The ``free_device_bytes`` probe, asked at most once per ``PROBE_INTERVAL_S`` (the
        scheduler offers staging on every pass of its loop)."""
        probe = self._opt.free_device_bytes
        if probe is None:
            return 0.0
        now = self._clock.now()
        if self._probe_at is None or now - self._probe_at >= PROBE_INTERVAL_S:
            self._probe_at, self._probe_free = now, probe()
        return self._probe_free

    def cancel_staging(self) -> None:
        """Stop staging; weights already woken go back to sleep (in the background)."""
        if not self._want_staged:
            return
        self._want_staged = False
        if not self._active:
            self._spawn(self._converge())

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._control_tasks.add(task)
        task.add_done_callback(self._control_tasks.discard)

    def _wanted(self) -> frozenset[str]:
        if self._want_active:
            return ALL_TAGS
        if self._want_staged:
            return frozenset({WEIGHTS})
        return frozenset()

    async def _converge(self) -> None:
        """Bring vLLM to the wanted state, one serialised call at a time: wake what is missing
        (all of it: ``wake_up()``), or sleep (level 1) when something awake is not wanted."""
        async with self._ctl:
            llm = self._engine()
            for _ in range(4):
                want = self._wanted()
                have = self._awake
                if want == have:
                    return
                if have <= want:
                    missing = want - have
                    if missing == ALL_TAGS:
                        await llm.wake_up()
                    else:
                        await llm.wake_up(tags=sorted(missing))
                    self._awake = want
                else:
                    await llm.sleep(level=1)
                    self._awake = frozenset()
                    self.epoch += 1


def _no_shutdown(*args: Any, **kwargs: Any) -> None:
    """Stands in for ``shutdown`` on an ``AsyncLLM`` already shut down."""


async def _aclose(stream: AsyncIterator[Any]) -> None:
    """Close vLLM's output stream early (vLLM aborts the request when it is closed)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


def _config_int(llm: Any, section: str, name: str) -> int | None:
    """``llm.vllm_config.<section>.<name>`` if it is a positive int (None for an engine without
    that config, e.g. a test fake)."""
    value = getattr(getattr(getattr(llm, "vllm_config", None), section, None), name, None)
    return value if isinstance(value, int) and value > 0 else None


# -- building one -------------------------------------------------------------------------------
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def _read_config(model_dir: str | Path) -> dict[str, Any]:
    """The model's ``config.json``: from a local directory, else from the Hugging Face cache
    (``huggingface_hub``, which honours ``HF_HUB_OFFLINE``)."""
    path = Path(model_dir)
    if path.is_dir():
        data: dict[str, Any] = json.loads((path / "config.json").read_text())
        return data
    from huggingface_hub import hf_hub_download

    return dict(json.loads(Path(hf_hub_download(str(model_dir), "config.json")).read_text()))


def has_weights(model_dir: str | Path) -> bool:
    path = Path(model_dir)
    if not path.is_dir():
        return True  # a repo id: vLLM downloads or finds the weights
    return any(p.name.endswith(WEIGHT_SUFFIXES) for p in path.iterdir())


def weight_bytes_from_index(model_dir: str | Path) -> float | None:
    """Total weight bytes from ``model.safetensors.index.json`` (``metadata.total_size``)."""
    index = Path(model_dir) / "model.safetensors.index.json"
    if not index.is_file():
        return None
    size = json.loads(index.read_text()).get("metadata", {}).get("total_size")
    return float(size) if isinstance(size, int | float) else None


def nvml_free_bytes(devices: Sequence[int]) -> Callable[[], float]:
    """A probe of the smallest free memory over ``devices`` (NVML indices), via ``pynvml``
    (``nvidia-ml-py``, a vLLM dependency on CUDA). Unverified here (no GPU on the dev machine)."""

    def probe() -> float:
        import pynvml

        pynvml.nvmlInit()
        try:
            free = [
                float(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).free)
                for i in devices
            ]
        finally:
            pynvml.nvmlShutdown()
        return min(free) if free else 0.0

    return probe


def vllm_engine_args(
    model_dir: str | Path, *, sleep_mode: bool, max_model_len: int, **engine_args: Any
) -> dict[str, Any]:
    """``AsyncEngineArgs`` fields for one engine: always our own tokenization
    (``skip_tokenizer_init``), prefix caching and priority scheduling; random weights
    (``load_format="dummy"``) for a directory holding only ``config.json``; sleep mode on the
    GPU path, eager mode on the CPU path (docs/sources.md §6). ``engine_args`` override any of
    them."""
    args: dict[str, Any] = {
        "model": str(model_dir),
        "skip_tokenizer_init": True,
        "enable_prefix_caching": True,
        "scheduling_policy": "priority",
        "max_model_len": max_model_len,
    }
    if not has_weights(model_dir):
        args["load_format"] = "dummy"
    if sleep_mode:
        args["enable_sleep_mode"] = True
    else:
        args["enforce_eager"] = True
    args.update(engine_args)
    return args


def build_vllm_engine(
    model_dir: str | Path,
    name: str,
    clock: Clock,
    node: str,
    *,
    sleep_mode: bool | None = None,
    max_model_len: int = 2048,
    rates: RateModel | Mapping[str, float] | None = None,
    ignore_eos: bool | None = None,
    tokenizer: Tokenizer | None = None,
    host_kv_survives_sleep: bool | None = None,
    weight_bytes_per_device: float | None = None,
    free_device_bytes: Callable[[], float] | None = None,
    sampling: Mapping[str, Any] | None = None,
    cost: CostModel | None = None,
    **engine_args: Any,
) -> VLLMEngine:
    """A ``VLLMEngine`` for ``model_dir`` (not started: ``await engine.start()``, one engine at
    a time). ``sleep_mode=None`` asks vLLM's platform (GPU: sleep mode; CPU: the gate).
    ``rates`` may be a mapping of ``RateModel`` fields (a node TOML's ``rates = {...}``).
    ``engine_args`` go to ``AsyncEngineArgs`` (``tensor_parallel_size``,
    ``gpu_memory_utilization``, ``kv_offloading_size``, ``kv_offloading_backend``, ...).
    With the byte tokenizer (the tiny models) the output is restricted to ``TEXT_IDS`` unless
    ``sampling`` sets ``allowed_token_ids``.

    On the CPU path ``VLLM_CPU_KVCACHE_SPACE`` defaults to 1 (GiB of KV cache per engine) if
    unset. Offline use of a local directory wants ``HF_HUB_OFFLINE=1`` (set by the caller).
    """
    gpu = sleep_mode_available() if sleep_mode is None else sleep_mode
    if not gpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    tp = int(engine_args.get("tensor_parallel_size", 1))
    args = vllm_engine_args(model_dir, sleep_mode=gpu, max_model_len=max_model_len, **engine_args)
    config = _read_config(model_dir)
    shape = KvShape.from_config(
        config,
        block_tokens=int(args.get("block_size") or 16),
        tensor_parallel_size=tp,
        kv_cache_dtype=str(args.get("kv_cache_dtype", "auto")),
    )
    dummy = args.get("load_format") == "dummy"
    if weight_bytes_per_device is None and gpu:
        total = weight_bytes_from_index(model_dir) if Path(model_dir).is_dir() else None
        weight_bytes_per_device = total / tp if total is not None else None
    if free_device_bytes is None and gpu:
        free_device_bytes = nvml_free_bytes(range(tp))
    if host_kv_survives_sleep is None:
        host_kv_survives_sleep = args.get("kv_offloading_backend") == "lmcache"
    tokenizer = tokenizer or load_tokenizer(model_dir)
    sampling = dict(sampling or {})
    if isinstance(tokenizer, ByteTokenizer):
        # random weights: keep the output printable, so that it round-trips (tokenizer.py)
        sampling.setdefault("allowed_token_ids", list(TEXT_IDS))
    options = VLLMEngineOptions(
        sleep_mode=gpu,
        max_model_len=max_model_len,
        ignore_eos=dummy if ignore_eos is None else ignore_eos,
        rates=rates if isinstance(rates, RateModel) else RateModel(**(rates or {})),
        host_kv_survives_sleep=host_kv_survives_sleep,
        weight_bytes_per_device=weight_bytes_per_device,
        free_device_bytes=free_device_bytes,
        sampling=sampling,
        cost=cost,
    )

    def make() -> AsyncLLMLike:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        llm: AsyncLLMLike = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        return llm

    async def factory() -> AsyncLLMLike:
        # from_engine_args blocks while the EngineCore process starts: keep the loop free.
        return await asyncio.to_thread(make)

    return VLLMEngine(
        name,
        factory,
        clock,
        node,
        kv_shape=shape,
        tokenizer=tokenizer,
        options=options,
    )


MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
"""The tiny random-weight test models shipped with the package (``tiny-llama-a``, ``-b``)."""


def tiny_model_dir(name: str) -> Path:
    """The directory of a shipped tiny model, e.g. ``tiny_model_dir("tiny-llama-a")``."""
    path = MODELS_DIR / name
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no tiny model {name!r} in {MODELS_DIR}")
    return path
