"""``talaria calibrate``, the live part: measure a running engine through the runtime server's HTTP
API (``proxy.runtimes.http.HttpRuntime``); the plan, the fits and the report are pure and live in
sim/calibrate.py (fitting: sim/fit.py).

Everything is timed with the runtime's own event timestamps (``t_s`` of its NDJSON stream, the
runtime's clock), so HTTP and this client's scheduling do not enter the measurements.

- **Prefill** of ``P`` prompt tokens after ``C`` cached ones: a session's call 0 of ``C`` tokens
  leaves its KV in the engine's prefix cache; call 1 of ``P`` tokens then reuses it (vLLM reports
  how many tokens it found: whole blocks only). One sample = admitted → first token (so it
  includes the call's intake), with n = P − cached, pairs = n·cached + n²/2, seqs = 1. Calls
  run one at a time.
- **Decode** of ``B`` sequences at context ``L``: ``B`` fresh sessions with ``L``-token prompts
  and ``K`` output tokens each start together, streaming. Once the last of them has its first
  token and until the first finishes, every engine step decodes all ``B``: the step time is the
  slope of tokens over time in that window (mean over the ``B`` calls), with n = seqs = B and
  pairs = Σ contexts at the window's middle.
- **Mixed steps**: ``B`` sequences decode at context ``L`` (streaming, long outputs); once all
  have their first token a call of ``P`` fresh tokens arrives, and its first step mixes its
  prefill with their decode. The engine's own timestamps time that step (``EngineTimes``:
  scheduled → first token, no intake), n = B + P, pairs = the decoders' contexts then +
  P²/2, seqs = B + 1; the fit's ``mixed_step_s`` is what such a step costs beyond its tokens
  (an engine without timestamps of its own gives no mixed samples). A point is run
  ``mixed_repeats`` times in a pass and the median-time run kept.
- **First use of a shape**: the prefill and mixed points run once unrecorded before the
  measured passes, so those time steps of shapes the engine has run; then prefills of fresh
  sizes (``shape_tokens``), each twice: ``StepFit.new_shape_s`` = median(first − second)
  (engine-timed; vLLM's CPU build builds a step's kernels per token count).
- **Idle wake-up**: calls of 64 tokens sent after the engine has been idle for each of
  ``idle_gaps_s``; the median admission → first token minus that at the shortest idle gives
  ``StepFit.idle_wake`` (an agent's calls come after tool gaps, so they often find the
  engine idle; on vLLM-CPU here the first token comes ~25 ms later after 1 s idle).
- **HTTP hop**: for each call made one at a time, the time this client (the proxy's own
  ``HttpRuntime``) saw minus the runtime's arrival → finish; the median, half each way, is the
  profile's ``transport_forward_s`` / ``transport_return_s`` (the replay adds them per call).
- **Co-resident decode** (two models or more, resident together: a node whose policy has
  ``co_residency`` and room for both): ``B`` sequences of one model decode at context
  ``L`` alone, then again while ``O`` sequences of another model decode beside it (the load
  starts first and runs 4× longer), over a grid of (B, O). ``ratio = shared step / alone step``, and
  ``coresident_interference`` α = median(ratio − 1) (one other busy engine, ``DeviceShare``:
  t' = t × (1 + α)); each point's prediction t × (1 + α) against its measurement is reported.
- **Switch and KV restore**: an engine that moves nothing at a switch (vLLM's CPU gate) has
  nothing to measure; otherwise the ``switch_s`` of the model's slots seen during the run are
  reported (not fitted: the server's transfer rates stay as the catalog gives them).
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from talaria.core.types import CallRequest, CallResult, Finished, FirstToken, TokenDelta
from talaria.proxy.runtimes.http import HttpRuntime
from talaria.sim.calibrate import (
    CalibrationPlan,
    CalibrationRun,
    ModelCalibration,
    check_models,
    plan_default_batched,
    switch_times,
)
from talaria.sim.fit import StepSample

Tick = Callable[[str, int], None]
"""Called after each measurement with (model, measurements planned for that model)."""


@dataclass(frozen=True)
class _Trace:
    """One streamed call: (runtime time, tokens so far) per event, and its result."""

    points: list[tuple[float, int]]
    result: CallResult


class Calibrator:
    """Runs a ``CalibrationPlan`` against one runtime server."""

    def __init__(self, runtime: HttpRuntime, plan: CalibrationPlan, tag: str = "calib") -> None:
        self._rt = runtime
        self._plan = plan
        self._ids = itertools.count()
        self._tag = tag
        self.hops_s: list[float] = []
        """HTTP hop of each call made one at a time (see ``_call``)."""

    def _request(
        self, model: str, session: str, index: int, prompt: int, output: int, stream: bool
    ) -> CallRequest:
        return CallRequest(
            request_id=f"{self._tag}-{next(self._ids)}",
            session_key=session,
            model=model,
            prompt_tokens=prompt,
            max_output_tokens=output,
            output_tokens=output,
            call_index=index,
            stream=stream,
        )

    async def _call(
        self, request: CallRequest, hop: bool = False, first: asyncio.Event | None = None
    ) -> _Trace:
        """One call; with ``hop``, also record its HTTP hop: the time this client saw it take
        minus the runtime's own arrival → finish (only for calls made one at a time).
        ``first`` is set at its first token."""
        points: list[tuple[float, int]] = []
        tokens = 0
        sent = time.perf_counter()
        async for event in self._rt.generate(request):
            if isinstance(event, FirstToken):
                tokens = 1
                points.append((event.t_s, tokens))
                if first is not None:
                    first.set()
            elif isinstance(event, TokenDelta):
                tokens += event.tokens
                points.append((event.t_s, tokens))
            elif isinstance(event, Finished):
                r = event.result
                if hop:
                    self.hops_s.append(time.perf_counter() - sent - (r.finished_s - r.arrival_s))
                points.append((r.finished_s, r.output_tokens))
                return _Trace(points, r)
        raise RuntimeError(f"call {request.request_id} ended without a result")

    def _session(self, model: str) -> str:
        return f"{self._tag}-{model}-{next(self._ids)}"

    async def warm_up(self, model: str) -> None:
        """Two calls, so the first measured one finds the model active and compiled paths hot."""
        for _ in range(2):
            await self._call(self._request(model, self._session(model), 0, 64, 4, False))

    async def prefill(
        self, model: str, prompt: int, cached: int
    ) -> tuple[StepSample, float | None]:
        """One prefill step, and the call's intake (None without the engine's timestamps).

        With the engine's own timestamps the step is timed alone (scheduled → the engine's
        first-token output) and the intake is the rest of the way to the first token on an idle
        engine: admitted → queued in the engine, plus the first token's delivery to the
        runtime. Without them the sample is admitted → first token and holds the intake."""
        session = self._session(model)
        index = 0
        if cached > 0:
            await self._call(self._request(model, session, 0, cached, 1, False))
            index = 1
        trace = await self._call(self._request(model, session, index, prompt, 1, False), True)
        r = trace.result
        hit = r.cached_tokens
        n = r.prompt_tokens - hit
        pairs = n * hit + n * n / 2
        times = r.engine
        if times is None:
            return StepSample(
                "prefill", n, pairs, 1, r.first_token_s - r.admitted_s, intake=1
            ), None
        step = times.first_token_s - times.scheduled_s
        intake = (times.queued_s - r.admitted_s) + (r.first_token_s - times.first_token_s)
        return StepSample("prefill", n, pairs, 1, step), intake

    async def decode(self, model: str, batch: int, context: int) -> StepSample:
        """One decode step of ``batch`` sequences at ``context`` tokens: the slope of tokens
        over time while all of them decode together (module docstring)."""
        k = self._plan.decode_tokens
        traces = await asyncio.gather(
            *(
                self._call(self._request(model, self._session(model), 0, context, k, True))
                for _ in range(batch)
            )
        )
        start = max(t.result.first_token_s for t in traces)
        end = min(t.result.finished_s for t in traces)
        slopes: list[float] = []
        contexts: list[float] = []
        for trace in traces:
            window = [(t, n) for t, n in trace.points if start <= t <= end]
            if len(window) < 2 or window[-1][1] - window[0][1] < 2:
                continue
            (t0, n0), (t1, n1) = window[0], window[-1]
            slopes.append((t1 - t0) / (n1 - n0))
            contexts.append(trace.result.prompt_tokens + (n0 + n1) / 2)
        if not slopes:
            raise RuntimeError(
                f"{model}: batch {batch} at context {context} never decoded together; "
                "raise decode_tokens"
            )
        pairs = sum(contexts) / len(contexts) * batch
        return StepSample("decode", batch, pairs, batch, statistics.fmean(slopes))

    async def _prefill_and_mixed(
        self,
        model: str,
        max_model_len: int,
        out: ModelCalibration | None,
        tick: Tick,
        total: int,
    ) -> None:
        """The prefill and mixed points once, recorded into ``out`` (None: a warm-up pass);
        ``tick(model, total)`` after each."""
        for prompt, cached in self._plan.prefill_points(max_model_len):
            sample, intake = await self.prefill(model, prompt, cached)
            if out is not None:
                out.samples.append(sample)
                if intake is not None:
                    out.intake_s.append(intake)
            tick(model, total)
        for batch, prompt in self._plan.mixed_points_for(max_model_len):
            repeats = self._plan.mixed_repeats if out is not None else 1  # warm-up: once
            runs = [await self.mixed(model, batch, prompt) for _ in range(repeats)]
            timed = sorted((s for s in runs if s is not None), key=lambda s: s.seconds)
            if out is not None and timed:
                out.samples.append(timed[(len(timed) - 1) // 2])
            tick(model, total)

    async def shape_pair(self, model: str, tokens: int) -> tuple[int, float, float] | None:
        """A prefill of ``tokens`` fresh tokens (a size no other measurement uses), then the
        same again: (tokens, first step s, second step s), engine-timed; None without the
        engine's timestamps. The difference is the first use of a step shape."""
        steps = []
        for _ in range(2):
            trace = await self._call(
                self._request(model, self._session(model), 0, tokens, 1, False)
            )
            times = trace.result.engine
            if times is None:
                return None
            steps.append(times.first_token_s - times.scheduled_s)
        return tokens, steps[0], steps[1]

    async def mixed(self, model: str, batch: int, prompt: int) -> StepSample | None:
        """One call of ``prompt`` fresh tokens joining ``batch`` sequences decoding at the
        plan's ``mixed_context``: its engine-timed first step (module docstring). None when
        the engine keeps no timestamps, or the decoders finished before that step did."""
        context, k = self._plan.mixed_context, 2 * self._plan.decode_tokens
        started = [asyncio.Event() for _ in range(batch)]
        load = asyncio.gather(
            *(
                self._call(
                    self._request(model, self._session(model), 0, context, k, True), first=event
                )
                for event in started
            )
        )
        for event in started:
            await event.wait()
        trace = await self._call(self._request(model, self._session(model), 0, prompt, 1, False))
        decoders = await load
        times = trace.result.engine
        if times is None or any(d.result.finished_s <= times.first_token_s for d in decoders):
            return None
        n = trace.result.prompt_tokens - trace.result.cached_tokens
        decoded = [
            max((tokens for t, tokens in d.points if t <= times.scheduled_s), default=1)
            for d in decoders
        ]
        pairs = float(
            sum(d.result.prompt_tokens + done for d, done in zip(decoders, decoded, strict=True))
        )
        pairs += n * trace.result.cached_tokens + n * n / 2
        seconds = times.first_token_s - times.scheduled_s
        return StepSample("mixed", batch + n, pairs, batch + 1, seconds, mixed=1)

    async def coresident(
        self, model: str, other: str, batch: int, context: int, other_batch: int | None = None
    ) -> dict[str, Any]:
        """``model``'s decode step alone, then while ``other`` decodes ``other_batch`` sequences
        (default: as many; started first, 4× as many tokens, so it decodes throughout the
        measured window)."""
        alone = await self.decode(model, batch, context)
        k = self._plan.decode_tokens
        load_batch = batch if other_batch is None else other_batch
        started = [asyncio.Event() for _ in range(load_batch)]
        load = asyncio.gather(
            *(
                self._call(
                    self._request(other, self._session(other), 0, context, 4 * k, True), first=event
                )
                for event in started
            )
        )
        for event in started:
            await event.wait()
        shared = await self.decode(model, batch, context)
        traces = await load
        covered = min(t.result.finished_s for t in traces)
        return {
            "model": model,
            "other": other,
            "batch": batch,
            "other_batch": load_batch,
            "context": context,
            "alone_s": alone.seconds,
            "shared_s": shared.seconds,
            "ratio": shared.seconds / alone.seconds,
            "load_finished_s": covered,
        }

    async def idle_ttft(self, model: str, idle_s: float) -> float:
        """Admission → first token of a 64-token call sent ``idle_s`` after the engine's last
        call finished (the sleep is the controlled idle time being measured)."""
        await asyncio.sleep(idle_s)
        request = self._request(model, self._session(model), 0, 64, 1, False)
        trace = await self._call(request, True)
        return trace.result.first_token_s - trace.result.admitted_s

    async def calibrate(
        self, model: str, max_model_len: int, tick: Tick, others: int = 0
    ) -> ModelCalibration:
        """Every measurement of the plan on ``model`` (``others``: models measured beside it
        later, for the progress count), ``tick`` after each."""
        out = ModelCalibration(model)
        total = self._plan.count(max_model_len, others)
        await self.warm_up(model)
        # An unrecorded pass of the prefill and mixed points first: the measured passes then
        # time steps of shapes the engine has run (decode samples are slopes over many steps of
        # one shape), and the first use of a shape is measured apart (``shape_pair``).
        await self._prefill_and_mixed(model, max_model_len, None, tick, total)
        for _ in range(self._plan.repeats):
            await self._prefill_and_mixed(model, max_model_len, out, tick, total)
            for batch, context in self._plan.decode_points(max_model_len):
                out.samples.append(await self.decode(model, batch, context))
                tick(model, total)
        for tokens in self._plan.shape_tokens:
            pair = await self.shape_pair(model, tokens)
            if pair is not None:
                out.shape_pairs.append(pair)
            tick(model, total)
        for gap in self._plan.idle_gaps_s:
            out.idle_ttft_s[gap] = [
                await self.idle_ttft(model, gap) for _ in range(self._plan.idle_repeats)
            ]
            tick(model, total)
        return out


async def run_calibration(
    url: str, models: Sequence[str], plan: CalibrationPlan, tick: Tick, token: str | None = None
) -> CalibrationRun:
    """Measure ``models`` one after another on the runtime at ``url`` (``token``: its runtime
    token) and fit each."""
    runtime = HttpRuntime(url, token=token)
    try:
        await runtime.start()
        info = check_models(await runtime.status_document(), models)
        first = info[models[0]]
        batched = first.get("max_num_batched_tokens") or plan_default_batched(first)
        calibrator = Calibrator(runtime, plan)
        measured: dict[str, ModelCalibration] = {}
        for model in models:
            limit = int(info[model]["max_model_len"])
            cal = await calibrator.calibrate(model, limit, tick, len(models) - 1)
            if info[model]["switches_cost"]:
                cal.switch_s = switch_times(await runtime.status_document(), model)
            measured[model] = cal
        coresident = []
        status = await runtime.status_document()
        active = [m for m, r in status.get("models", {}).items() if r.get("state") == "active"]
        pairs = itertools.permutations(models, 2) if len(set(active) & set(models)) > 1 else ()
        for model, other in pairs:
            for _ in range(plan.coresident_repeats):
                for batch, load, context in plan.coresident_points:
                    point = await calibrator.coresident(model, other, batch, context, load)
                    coresident.append(point)
                    tick(model, plan.count(int(info[model]["max_model_len"]), len(models) - 1))
    finally:
        await runtime.close()
    fits = {m: cal.fit() for m, cal in measured.items()}
    return CalibrationRun(
        measured,
        fits,
        int(batched),
        int(first["block_tokens"]),
        any(bool(i["switches_cost"]) for i in info.values()),
        calibrator.hops_s,
        coresident,
    )
