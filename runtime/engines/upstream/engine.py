"""``UpstreamEngine``: the ``Engine`` seam over an OpenAI-compatible server that runs on its
own (``vllm serve``, SGLang, llama.cpp's server), reached over HTTP (client.py) and switched
through its own sleep endpoints (sleep.py). docs/upstream.md says how to configure it.

What it cannot know, it does not claim:

- The KV pool is the server's: the engine has no ``MemoryAccounting`` (the server preempts or
  queues when full; the node never keeps a call waiting for memory on its behalf).
  ``session_kv`` (``OwnKv``) lists the sessions it served since the server last slept
  (their last prompt + output tokens, ``HBM``), best effort: the server's own evictions are
  not seen. A call's KV source comes from the server's usage
  (``prompt_tokens_details.cached_tokens``): ``HBM`` when > 0, else ``RECOMPUTE`` for a
  session it served before, ``NEW`` for a first call; the cached tokens the caller sees
  depend on ``cache_isolation`` (generation.py, which runs each call).
- A server that cannot be reached during a call (no connection: ``UpstreamUnreachable``) makes
  the engine faulty (``Health.fault``): the node's status leaves the model out, so the proxy
  sends its calls to other replicas, and the engine asks the server's ``GET /v1/models`` every
  ``PROBE_S`` until it answers, then serves again. The call that found it down fails (503).
- Nothing the server sends is trusted to be small, quick or honest: every read is bounded
  (reading.py), the output is cut at the call's limit and the usage checked (usage.py).
- Timing is a linear rate model (options.py ``UPSTREAM_RATES``, est.); the switch-in estimate
  is the last wake it measured. Host KV (``keep_kv_on_host``) is the server's own connector's
  (e.g. LMCache); a level-1 sleep drops the device's KV.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator

from talaria.core.clock import Clock
from talaria.core.types import (
    CallRejected,
    CallRequest,
    Finished,
    GenerationEvent,
    KvSource,
)
from talaria.runtime.engine import Admission, EngineInfo
from talaria.runtime.engines.serving import ServedEngine, ServingState
from talaria.runtime.engines.upstream.client import LOGGED_CHARS, UpstreamClient, served_window
from talaria.runtime.engines.upstream.generation import CallSite, generate
from talaria.runtime.engines.upstream.options import UpstreamOptions
from talaria.runtime.engines.upstream.reading import UpstreamUnavailable, UpstreamUnreachable
from talaria.runtime.engines.upstream.sleep import SleepControl

log = logging.getLogger(__name__)

SESSIONS_KEPT = 4096
"""Sessions whose last call the engine remembers (for ``session_kv`` and KV sources)."""
PROBE_S = 2.0
"""How often a faulty engine asks its server whether it answers again (clock seconds)."""
BLOCK_TOKENS = 16
"""Reported in ``info`` only: the server's block size is not visible over HTTP (vLLM's GPU
default)."""


class UpstreamEngine(ServedEngine):
    """One model served by an upstream server, behind the ``Engine`` protocol, with its
    ``Switching``, ``Staging``, ``KvTiming`` and ``OwnKv`` capabilities (see the module
    docstring). ``await start()`` before use, ``await shutdown()`` at the end."""

    def __init__(self, name: str, options: UpstreamOptions, clock: Clock, node: str) -> None:
        self.model = name
        self._opt = options
        self._clock = clock
        self._node = node
        self._client = UpstreamClient(options)
        self._sleep = SleepControl(options.sleep, self._client)
        self._rates = options.rates
        self._window = options.context_window
        self._started = False
        self._state = ServingState(name, clock)
        self._staging = False
        self._site = CallSite(name, self._client, options, clock, node, self._state.busy)
        self._sessions: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._wake_s: float | None = None
        self._fault: str | None = None
        """Why the last wake failed (None: it did not): the next call wakes again first."""
        self._down: str | None = None
        """Why the server could not be reached (None: it could): ``fault``."""
        self._probe: asyncio.Task[None] | None = None

    @property
    def options(self) -> UpstreamOptions:
        """Its options (URL, served model, sleep kind, …)."""
        return self._opt

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Check that the server answers ``GET /v1/models`` and lists ``served_model`` (the
        window it reports there is the context window unless given: ``served_window``), then
        put it to sleep if it has sleep endpoints. ``UpstreamUnavailable`` names the URL (and
        the models it lists)."""
        if self._started:
            return
        served = self._opt.served_model
        models = await self._client.models()
        entry = next((m for m in models if m.get("id") == served), None)
        if entry is None:  # the ids it lists go to the log, not to whoever placed the model
            listed = ", ".join(str(m.get("id"))[:100] for m in models[:20])
            log.warning("upstream %s lists %s", self._client.url, listed[:LOGGED_CHARS] or "none")
            raise UpstreamUnavailable(
                f"upstream {self._client.url} does not serve {served!r} (it lists "
                f"{len(models)} models: see the runtime's log); set served_model to one of them"
            )
        if self._window is None:
            self._window = served_window(entry)
            if self._window is None:
                raise UpstreamUnavailable(
                    f"upstream {self._client.url} does not report a context window for "
                    f"{served!r} (max_model_len or meta.n_ctx); set context_window in the "
                    "model's options"
                )
        await self._sleep.put_to_sleep_at_start()
        self._started = True
        self._state.active = False

    async def shutdown(self) -> None:
        """Close the HTTP client. A server the engine put to sleep stays asleep (waking it
        could find another server awake in its memory)."""
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
        await self._sleep.stop()
        await self._client.close()
        self._started = False
        self._state.active = False

    # -- state -----------------------------------------------------------------------------
    @property
    def staging(self) -> bool:
        """Weights are being (or have been) woken ahead of a switch (vLLM, ``staging``)."""
        return self._staging and not self._state.active

    @property
    def staged_fraction(self) -> float:
        """1 once the weights are awake ahead of a switch, else 0."""
        return 1.0 if self.staging and self._sleep.weights_awake else 0.0

    def info(self) -> EngineInfo:
        """Kind ``openai``; switches cost when the server has sleep endpoints; its context
        window (0 before ``start`` when not given)."""
        return EngineInfo("openai", self._sleep.switches, BLOCK_TOKENS, None, self._window or 0)

    def fault(self) -> str | None:
        """Why the server cannot be reached now (``Health``; the module docstring)."""
        return self._down

    def _found_down(self, why: str) -> None:
        """The server could not be reached: faulty until a probe finds it answering."""
        if self._down is None:
            log.warning("%s: %s; left out until it answers", self.model, why)
        self._down = why
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._wait_until_up())

    async def _wait_until_up(self) -> None:
        while self._down is not None:
            await self._clock.sleep(PROBE_S)
            with contextlib.suppress(UpstreamUnavailable):
                await self._client.models()
                log.warning("%s: the server answers again", self.model)
                self._down = None

    def session_kv(self) -> dict[str, tuple[int, KvSource]]:
        """Sessions served since the server last slept: (last prompt + output tokens,
        ``HBM``); best effort (the module docstring says what it cannot see)."""
        epoch = self._sleep.epoch
        return {s: (t, KvSource.HBM) for s, (t, e) in self._sessions.items() if e == epoch}

    # -- estimates -------------------------------------------------------------------------
    @property
    def device_bytes(self) -> float | None:
        """The shared device's memory, if the node config gives it (``device_bytes``)."""
        return self._opt.device_bytes

    @property
    def weight_bytes(self) -> float:
        """What the server holds while awake (``weight_bytes``), for co-residency; 0 for a
        server without sleep endpoints, which stays resident whatever it holds."""
        return self._opt.weight_bytes if self._sleep.switches else 0.0

    def switch_in_s(self) -> float:
        """0 when active or without sleep endpoints; ``kv_wake_s`` once the weights are
        staged; else the last wake measured (``wake_s`` before any)."""
        if self._state.active or not self._sleep.switches:
            return 0.0
        if self.staging and self._sleep.weights_awake:
            return self._rates.kv_wake_s
        return self._rates.wake_s if self._wake_s is None else self._wake_s

    def kv_restore_s(self, tokens: int) -> float:
        """``tokens × kv_restore_s_per_token`` (0 by default: a host tier is the server's)."""
        return self._rates.restore_s(tokens)

    def recompute_s(self, tokens: int) -> float:
        """``tokens × prefill_s_per_token``."""
        return self._rates.prefill_s(tokens)

    def _predict(self, request: CallRequest) -> tuple[KvSource, int]:
        held = self._sessions.get(request.session_key)
        if held is None:
            return KvSource.NEW, 0
        tokens, epoch = held
        if epoch != self._sleep.epoch:
            return KvSource.RECOMPUTE, 0
        return KvSource.HBM, max(0, min(tokens, request.prompt_tokens - 1))

    def estimate_service_s(self, request: CallRequest, expected_output_tokens: int) -> float:
        """Uncached prompt tokens × ``prefill_s_per_token`` + expected output × the decode step
        at the current batch (``RateModel``), the cached prefix predicted from its session."""
        _, cached = self._predict(request)
        prefill = max(0, request.prompt_tokens - cached) * self._rates.prefill_s_per_token
        return prefill + expected_output_tokens * self.decode_step_s(self._state.running + 1, 0)

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """``decode_step_s + (batch − 1) × decode_step_s_per_seq`` (``RateModel``)."""
        return self._rates.decode_step(batch)

    # -- admission and generation ----------------------------------------------------------
    def try_admit(
        self, request: CallRequest, arrival_s: float, sp_admitted: bool
    ) -> Admission | None:
        """Admit whenever active (the server owns the KV memory), with the prefix it
        predicts from the session."""
        source, cached = self._predict(request)
        return self._state.admit(request, arrival_s, sp_admitted, source, cached)

    def run(self, admission: Admission) -> AsyncIterator[GenerationEvent]:
        """Send the call to the server and stream its answer: ``FirstToken`` (with the
        admission's predicted cache), ``TokenDelta``s for a streaming call (one per chunk),
        then ``Finished`` with the server's usage. Closed early, the HTTP stream closes."""
        return self._state.serve(self._generate(admission))

    async def _generate(self, admission: Admission) -> AsyncGenerator[GenerationEvent, None]:
        request = admission.request
        call = request.call
        if call is None or call.messages is None:
            raise CallRejected(
                "invalid_value",
                f"Model {self.model} is served by an upstream chat server: it takes chat "
                "messages only (no text prompt or replayed trace entry).",
                param="prompt",
            )
        if self._fault is not None:  # the slot's wake failed: try once more, else fail
            try:
                await self._sleep.wake()
            except UpstreamUnavailable as exc:
                raise UpstreamUnavailable(f"{self.model}: not awake: {exc}") from exc
            self._fault = None
        held = self._sessions.pop(request.session_key, None)
        events = generate(self._site, admission, held)
        try:
            async with contextlib.aclosing(events):
                async for event in events:
                    if isinstance(event, Finished):  # remembered at the current sleep epoch
                        done = event.result
                        tokens = done.prompt_tokens + done.output_tokens
                        self._sessions[request.session_key] = (tokens, self._sleep.epoch)
                        while len(self._sessions) > SESSIONS_KEPT:
                            self._sessions.popitem(last=False)
                    yield event
        except UpstreamUnreachable as exc:
            self._found_down(str(exc))
            raise

    # -- switching -------------------------------------------------------------------------
    async def activate(self) -> float:
        """Open for admission: wake the server (sleep.py; only its KV pool if the weights
        were staged); without sleep endpoints a gate, ~0 s. Returns the seconds it took (the
        next ``switch_in_s`` estimate). A failed wake does not raise (the node would retry the
        switch without end while its calls wait): it is logged, the engine opens, and each call
        tries the wake again first, failing with ``UpstreamUnavailable`` (a 503) if it fails."""
        start = self._clock.now()
        if self._sleep.switches:
            try:
                await self._sleep.wake()
                self._fault = None
            except UpstreamUnavailable as exc:  # its calls fail fast (503) rather than wait
                log.warning("%s: wake failed: %s", self.model, exc)
                self._fault = str(exc)
            if not self._staging and self._fault is None:
                self._wake_s = self._clock.now() - start
        self._staging = False
        self._state.open()
        return self._clock.now() - start

    async def deactivate(self, keep_kv_on_host: bool, keep_host_weight_copy: bool) -> float:
        """Close for admission once drained, and put the server to sleep (vLLM's
        ``/sleep?level=1``, SGLang's ``/release_memory_occupation``); without sleep endpoints a
        gate. ``keep_kv_on_host`` / ``keep_host_weight_copy`` are the server's business (its
        KV connector; vLLM's level-1 sleep keeps the weights in host memory). A failed sleep is
        logged, not raised: the switch goes on."""
        self._state.close()
        start = self._clock.now()
        self._staging = False
        try:
            await self._sleep.sleep()
        except UpstreamUnavailable as exc:  # the node goes on; the next wake may then fail
            log.warning("%s: sleep failed: %s", self.model, exc)
        return self._clock.now() - start

    def start_staging(self) -> bool:
        """With ``staging`` (vLLM only): wake the weights in the background ahead of the
        switch; False otherwise."""
        if not self._opt.staging or self._state.active or self._staging or not self._started:
            return False
        self._staging = True
        self._sleep.spawn(self._sleep.stage())
        return True

    def cancel_staging(self) -> None:
        """Stop staging; weights already woken go back to sleep (in the background)."""
        if not self._staging:
            return
        self._staging = False
        if not self._state.active:
            self._sleep.spawn(self._sleep.unstage())
