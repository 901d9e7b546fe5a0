"""VLLMEngine against a fake ``AsyncLLM`` (no vLLM needed), on the virtual-time loop.

The fake records every call (sleep with its level, wake_up with its tags, generate with its
priority and sampling parameters), emulates vLLM's prefix cache (whole 16-token blocks of
earlier prompt + output sequences, never the last prompt token; emptied by ``sleep`` unless a
host tier is emulated) and streams one token per ``STEP_S`` as ``RequestOutput``-like objects
in DELTA mode.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import pytest

from talaria.core.calls import DEFAULT_SAMPLING, Call, Sampling
from talaria.core.clock import LoopClock, run_virtual
from talaria.core.types import (
    CallRejected,
    CallRequest,
    CallResult,
    Finished,
    FirstToken,
    GenerationEvent,
    KvSource,
    Priority,
    TokenDelta,
)
from talaria.runtime.engine import MemoryAccounting
from talaria.runtime.engines.tokenizer import BYTE_OFFSET, TEXT_IDS, ByteTokenizer
from talaria.runtime.engines.vllm import (
    KvShape,
    RateModel,
    VLLMEngine,
    VLLMEngineOptions,
    build_vllm_engine,
    cpu_has_native_bf16,
    tiny_model_dir,
    vllm_engine_args,
    vllm_priority,
)
from talaria.runtime.memory.resources import NodeMemory
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import ROUND, TALARIA, SchedulerFlags
from talaria.runtime.scheduling.node import NodeScheduler

T = TypeVar("T")
STEP_S = 0.01
SLEEP_S = 0.03
WAKE_S_PER_TAG = 0.02
RELOAD_S = 0.2
BLOCK = 16
REPLY = "ok, done. "
SHAPE = KvShape(layers=2, kv_heads=2, head_dim=32, dtype_bytes=2, block_tokens=BLOCK)


@dataclass
class FakeCompletion:
    token_ids: list[int]


@dataclass
class FakeStats:
    """vLLM's ``RequestStateStats`` timestamps, on the fake engine's own clock."""

    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0


@dataclass
class FakeOutput:
    request_id: str
    num_cached_tokens: int
    outputs: list[FakeCompletion]
    finished: bool
    metrics: FakeStats | None = None


ENGINE_CLOCK_OFFSET_S = 1000.0
"""The fake EngineCore's clock reads this much more than the runtime's (another process's
monotonic clock need not share its origin with the loop's)."""


@dataclass
class FakeLLM:
    """Records calls; generates the bytes of ``REPLY`` over and over, one token per step."""

    clock: LoopClock
    keep_cache_on_sleep: bool = False
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    cache: list[list[int]] = field(default_factory=list)
    shut: bool = False
    delivery_lag_s: float = 0.0
    """Each output reaches the engine this long after the fake EngineCore stamped it."""
    stats: bool = True
    """Whether outputs carry ``metrics`` (vLLM with ``disable_log_stats`` has none)."""

    def engine_now(self) -> float:
        return self.clock.now() + ENGINE_CLOCK_OFFSET_S

    async def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))
        await self.clock.sleep(SLEEP_S)
        if not self.keep_cache_on_sleep:
            self.cache.clear()

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(("wake_up", tags))
        await self.clock.sleep(WAKE_S_PER_TAG * (len(tags) if tags else 2))
        return True

    async def collective_rpc(self, method: str) -> list[None]:
        self.calls.append(("collective_rpc", method))
        await self.clock.sleep(RELOAD_S)
        return [None]

    async def abort(self, request_id: str) -> None:
        self.calls.append(("abort", request_id))

    def shutdown(self) -> None:
        self.shut = True

    def _cached(self, ids: list[int]) -> int:
        best = 0
        for seq in self.cache:
            n = 0
            while n < min(len(seq), len(ids)) and seq[n] == ids[n]:
                n += 1
            best = max(best, n)
        best = min(best, len(ids) - 1)
        return best - best % BLOCK

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, *, priority: int = 0
    ) -> AsyncIterator[FakeOutput]:
        self.calls.append(("generate", request_id, priority, sampling_params, prompt))
        stats = FakeStats(queued_ts=self.engine_now()) if self.stats else None
        ids = list(prompt["prompt_token_ids"])
        cached = self._cached(ids)
        reply = [BYTE_OFFSET + b for b in REPLY.encode()]
        out: list[int] = []
        n = sampling_params["max_tokens"]
        if stats is not None:
            stats.scheduled_ts = self.engine_now()
        await self.clock.sleep((len(ids) - cached) * 1e-4)
        for i in range(n):
            await self.clock.sleep(STEP_S)
            out.append(reply[i % len(reply)])
            done = i == n - 1
            if done:
                self.cache.append(ids + out)
            if stats is not None:
                stamped = self.engine_now() - self.delivery_lag_s
                stats.first_token_ts = stats.first_token_ts or stamped
                stats.last_token_ts = stamped
            yield FakeOutput(request_id, cached, [FakeCompletion([out[-1]])], done, stats)


@dataclass
class FakeApi:
    llm: FakeLLM

    def engine_now(self) -> float:
        return self.llm.engine_now()

    def tokens_prompt(self, ids: list[int]) -> dict[str, Any]:
        return {"prompt_token_ids": ids}

    def sampling_params(self, *, max_tokens: int, ignore_eos: bool, **extra: Any) -> dict[str, Any]:
        return {"max_tokens": max_tokens, "ignore_eos": ignore_eos, **extra}


def make_engine(
    name: str,
    clock: LoopClock,
    *,
    sleep_mode: bool,
    free_bytes: float | None = None,
    host_kv: bool = False,
    rates: RateModel | None = None,
    device_bytes: float | None = None,
    memory_share: float = 0.9,
    sleep_level: int = 1,
    llm: FakeLLM | None = None,
) -> tuple[VLLMEngine, FakeLLM]:
    llm = llm or FakeLLM(clock, keep_cache_on_sleep=host_kv)
    options = VLLMEngineOptions(
        sleep_mode=sleep_mode,
        sleep_level=sleep_level,
        max_model_len=2048,
        rates=rates or RateModel(wake_s=2.0, kv_wake_s=0.5),
        host_kv_survives_sleep=host_kv,
        weight_bytes_per_device=1e9,
        free_device_bytes=(lambda: free_bytes) if free_bytes is not None else None,
        device_bytes=device_bytes,
        memory_share=memory_share,
        sampling={"temperature": 0.0},
    )
    engine = VLLMEngine(
        name,
        lambda: llm,
        clock,
        "node0",
        kv_shape=SHAPE,
        tokenizer=ByteTokenizer(),
        options=options,
        api=FakeApi(llm),
    )
    return engine, llm


def virtual(body: Callable[[LoopClock], Coroutine[Any, Any, T]]) -> T:
    return run_virtual(body(LoopClock()))


def request(
    rid: str,
    session: str = "s1",
    messages: tuple[dict[str, Any], ...] | None = None,
    *,
    model: str = "a",
    call_index: int = 0,
    max_out: int = 12,
    stream: bool = False,
    prompt_tokens: int = 100,
    prompt_text: str | None = None,
    sampling: Sampling = DEFAULT_SAMPLING,
) -> CallRequest:
    return CallRequest(
        request_id=rid,
        session_key=session,
        model=model,
        prompt_tokens=prompt_tokens,
        max_output_tokens=max_out,
        call_index=call_index,
        stream=stream,
        call=None
        if messages is None and prompt_text is None and sampling == DEFAULT_SAMPLING
        else Call(model, messages=messages, prompt=prompt_text, sampling=sampling),
    )


async def serve(
    engine: VLLMEngine, req: CallRequest, sp: bool = False
) -> tuple[list[GenerationEvent], CallResult]:
    admission = engine.try_admit(req, engine_now(engine), sp)
    assert admission is not None
    events = [e async for e in engine.run(admission)]
    last = events[-1]
    assert isinstance(last, Finished)
    return events, last.result


def engine_now(engine: VLLMEngine) -> float:
    return asyncio.get_running_loop().time()


def gens(llm: FakeLLM) -> list[tuple[Any, ...]]:
    return [c for c in llm.calls if c[0] == "generate"]


def switches(llm: FakeLLM) -> list[tuple[Any, ...]]:
    return [c for c in llm.calls if c[0] in ("sleep", "wake_up", "collective_rpc")]


SYSTEM = {"role": "system", "content": "You are a careful coding agent. " * 4}
USER = {"role": "user", "content": "Please fix the failing test in the repository."}


# -- GPU path ---------------------------------------------------------------------------------
def test_gpu_start_sleeps_activate_wakes_deactivate_sleeps() -> None:
    async def body(clock: LoopClock) -> None:
        engine, llm = make_engine("a", clock, sleep_mode=True)
        await engine.start()
        assert llm.calls == [("sleep", 1)]  # asleep after start: the next engine can start
        assert not engine.active and engine.awake_tags == frozenset()
        assert engine.switch_in_s() == 2.0
        assert await engine.activate() == pytest.approx(2 * WAKE_S_PER_TAG)
        assert llm.calls[-1] == ("wake_up", None)  # weights and kv_cache: both
        assert engine.active and engine.switch_in_s() == 0.0
        _, result = await serve(engine, request("r1", messages=(SYSTEM, USER)))
        assert result.output_tokens == 12
        slept = await engine.deactivate(keep_kv_on_host=True, keep_host_weight_copy=False)
        assert slept == pytest.approx(SLEEP_S)
        assert switches(llm) == [("sleep", 1), ("wake_up", None), ("sleep", 1)]
        assert engine.epoch == 1 and engine.last_keep_kv_on_host is True
        await engine.shutdown()
        assert llm.shut and not engine.started

    virtual(body)


def test_sleep_level_2_discards_the_weights_and_each_wake_reloads_them() -> None:
    async def body(clock: LoopClock) -> None:
        engine, llm = make_engine("a", clock, sleep_mode=True, free_bytes=5e9, sleep_level=2)
        await engine.start()
        assert switches(llm) == [("sleep", 2)]
        woke = await engine.activate()
        reload = [("wake_up", ["weights"]), ("collective_rpc", "reload_weights")]
        assert switches(llm)[1:] == [*reload, ("wake_up", ["kv_cache"])]
        assert woke == pytest.approx(2 * WAKE_S_PER_TAG + RELOAD_S)
        _, result = await serve(engine, request("r1", messages=(SYSTEM, USER)))
        assert result.output_tokens == 12
        await engine.deactivate(keep_kv_on_host=False, keep_host_weight_copy=True)
        assert switches(llm)[-1] == ("sleep", 2) and engine.epoch == 1
        # staged ahead of the next slot: the reload happens then, the switch wakes the KV only
        del llm.calls[:]
        assert engine.start_staging()
        await clock.sleep(1.0)
        assert switches(llm) == reload
        await engine.activate()
        assert switches(llm) == [*reload, ("wake_up", ["kv_cache"])]
        # a cancelled staging discards the reloaded weights again: the next wake reloads
        await engine.deactivate(keep_kv_on_host=False, keep_host_weight_copy=True)
        del llm.calls[:]
        assert engine.start_staging()
        await clock.sleep(1.0)
        engine.cancel_staging()
        await clock.sleep(1.0)
        await engine.activate()
        assert switches(llm) == [*reload, ("sleep", 2), *reload, ("wake_up", ["kv_cache"])]

    virtual(body)


def test_a_sleep_level_other_than_1_or_2_is_refused() -> None:
    with pytest.raises(ValueError, match="sleep level must be 1 or 2, not 3"):
        make_engine("a", LoopClock(), sleep_mode=True, sleep_level=3)


def test_deactivate_requires_a_drained_engine() -> None:
    async def body(clock: LoopClock) -> None:
        engine, llm = make_engine("a", clock, sleep_mode=True)
        await engine.start()
        await engine.activate()
        admission = engine.try_admit(request("r1"), 0.0, False)
        assert admission is not None and engine.running == 1
        with pytest.raises(RuntimeError, match="running"):
            await engine.deactivate(keep_kv_on_host=False, keep_host_weight_copy=False)
        assert [e async for e in engine.run(admission)]
        assert engine.running == 0
        await engine.deactivate(keep_kv_on_host=False, keep_host_weight_copy=False)
        assert switches(llm)[-1] == ("sleep", 1)

    virtual(body)


def test_try_admit_needs_an_active_engine() -> None:
    async def body(clock: LoopClock) -> None:
        engine, _ = make_engine("a", clock, sleep_mode=True)
        await engine.start()
        with pytest.raises(RuntimeError, match="not active"):
            engine.try_admit(request("r1"), 0.0, False)

    virtual(body)


def test_staging_wakes_weights_then_activate_wakes_kv_cache() -> None:
    async def body(clock: LoopClock) -> None:
        engine, llm = make_engine("b", clock, sleep_mode=True, free_bytes=5e9)
        await engine.start()
        assert engine.start_staging()
        assert engine.staging
        assert not engine.start_staging()  # already staging
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert llm.calls[-1] == ("wake_up", ["weights"])
        assert engine.staged_fraction == 0.0  # the wake is under way
        assert engine.switch_in_s() == 2.0
        await clock.sleep(0.1)
        assert engine.staged_fraction == 1.0
        assert engine.switch_in_s() == 0.5  # only the KV pool is left to wake
        assert await engine.activate() == pytest.approx(WAKE_S_PER_TAG)
        assert switches(llm) == [("sleep", 1), ("wake_up", ["weights"]), ("wake_up", ["kv_cache"])]
        assert engine.active and not engine.staging
        assert engine.awake_tags == frozenset({"weights", "kv_cache"})

    virtual(body)


def test_staging_only_when_the_weights_fit() -> None:
    async def body(clock: LoopClock) -> None:
        engine, llm = make_engine("b", clock, sleep_mode=True, free_bytes=0.5e9)
        await engine.start()
        assert not engine.start_staging()
        no_probe, _ = make_engine("c", clock, sleep_mode=True)
        await no_probe.start()
        assert not no_probe.start_staging()
        assert switches(llm) == [("sleep", 1)]

    virtual(body)


def test_cancel_staging_puts_the_weights_back_to_sleep() -> None:
    async def body(clock: LoopClock) -> None:
        engine, llm = make_engine("b", clock, sleep_mode=True, free_bytes=5e9)
        await engine.start()
        assert engine.start_staging()
        await clock.sleep(0.1)
        engine.cancel_staging()
        await clock.sleep(0.1)
        assert switches(llm) == [("sleep", 1), ("wake_up", ["weights"]), ("sleep", 1)]
        assert engine.awake_tags == frozenset() and not engine.staging
        engine.cancel_staging()  # not staging: nothing happens
        await clock.sleep(0.1)
        assert len(switches(llm)) == 3
        # cancelled before the wake ran: no wake and no sleep at all
        assert engine.start_staging()
        engine.cancel_staging()
        await clock.sleep(0.1)
        assert len(switches(llm)) == 3
        await engine.activate()
        assert switches(llm)[-1] == ("wake_up", None)

    virtual(body)


def test_vllm_gets_the_calls_class_then_sp_first_within_it() -> None:
    async def body(clock: LoopClock) -> None:
        engine, llm = make_engine("a", clock, sleep_mode=False)
        await engine.start()
        await engine.activate()
        await serve(engine, request("r1", messages=(SYSTEM, USER)), sp=False)
        await serve(engine, request("r2", messages=(SYSTEM, USER)), sp=True)
        for n, priority in enumerate(Priority):
            call = replace(request(f"c{n}", messages=(SYSTEM, USER)), priority=priority)
            await serve(engine, call, sp=False)
        priorities = [g[2] for g in gens(llm)]
        # standard: 3, SP-admitted 2; interactive 1, standard 3, batch 5 (lower runs first)
        assert priorities == [3, 2, 1, 3, 5]
        params = gens(llm)[0][3]
        assert params == {"max_tokens": 12, "ignore_eos": True, "temperature": 0.0}
        request_ids = [g[1] for g in gens(llm)]
        assert request_ids[0].startswith("r1#") and len(set(request_ids)) == 5

    virtual(body)


def test_a_token_call_takes_the_callers_sampling_but_not_stop_strings() -> None:
    async def body(clock: LoopClock) -> None:
        engine, llm = make_engine("a", clock, sleep_mode=False)
        await engine.start()
        await engine.activate()
        sampling = Sampling(temperature=0.7, top_p=0.9, seed=5, stop=("x",), logprobs=True)
        await serve(engine, request("r1", prompt_text="hello", sampling=sampling), sp=False)
        params = gens(llm)[0][3]
        assert params == {
            "max_tokens": 12,
            "ignore_eos": True,
            "temperature": 0.7,
            "top_p": 0.9,
            "seed": 5,
        }

    virtual(body)


def test_cached_tokens_and_text_flow_into_events_and_results() -> None:
    async def body(clock: LoopClock) -> None:
        engine, _ = make_engine("a", clock, sleep_mode=True)
        await engine.start()
        await engine.activate()
        first = request("r1", messages=(SYSTEM, USER), stream=True)
        events, result = await serve(engine, first)
        tok = ByteTokenizer()
        prompt_ids = tok.encode_chat([SYSTEM, USER])
        assert isinstance(events[0], FirstToken)
        assert events[0].cached_tokens == 0 and events[0].kv_source is KvSource.NEW
        assert events[0].delta.text == "o"
        deltas = [e for e in events if isinstance(e, TokenDelta)]
        assert sum(d.tokens for d in deltas) == 11
        assert events[0].delta.text + "".join(d.delta.text for d in deltas) == result.output.text
        assert result.output.text == (REPLY * 2)[:12]
        assert result.prompt_tokens == len(prompt_ids) != first.prompt_tokens
        assert result.first_token_s < result.finished_s

        # The continuation: prompt + output + a tool result. Its prefix is cached.
        reply = {"role": "assistant", "content": result.output.text}
        tool = {"role": "tool", "content": "1 failed"}
        second = request("r2", messages=(SYSTEM, USER, reply, tool), call_index=1)
        admission = engine.try_admit(second, 0.0, False)
        assert admission is not None
        assert admission.kv_source is KvSource.HBM and admission.cached_tokens > 0
        events = [e async for e in engine.run(admission)]
        assert len(events) == 2  # not streaming: FirstToken then Finished
        head, done = events
        assert isinstance(head, FirstToken) and isinstance(done, Finished)
        expected = (len(prompt_ids) + 12) // BLOCK * BLOCK
        assert head.cached_tokens == done.result.cached_tokens == expected
        assert admission.cached_tokens == expected  # the prediction matched
        assert head.kv_source is done.result.kv_source is KvSource.HBM
        assert done.result.recomputed_tokens == 0 and done.result.restored_bytes == 0.0

    virtual(body)


@pytest.mark.parametrize("lag_s", [0.0, 0.004])
def test_results_carry_the_engines_own_timestamps_on_the_runtime_clock(lag_s: float) -> None:
    """vLLM's EngineCore stamps on a clock of its own; the result carries them moved onto the
    runtime's clock, so the host's delivery lag is what separates them from the runtime's
    own first-token and finish times."""

    async def body(clock: LoopClock) -> None:
        engine, llm = make_engine("a", clock, sleep_mode=True)
        llm.delivery_lag_s = lag_s
        await engine.start()
        await engine.activate()
        _, result = await serve(engine, request("r1", messages=(SYSTEM, USER), max_out=5))
        times = result.engine
        assert times is not None
        assert times.queued_s == pytest.approx(result.admitted_s)  # the fake hands over at once
        assert times.scheduled_s == pytest.approx(times.queued_s)
        assert result.first_token_s - times.first_token_s == pytest.approx(lag_s)
        assert result.finished_s - times.last_token_s == pytest.approx(lag_s)
        assert times.last_token_s - times.first_token_s == pytest.approx(4 * STEP_S)

    virtual(body)


def test_an_engine_without_stats_reports_no_engine_times() -> None:
    async def body(clock: LoopClock) -> None:
        engine, llm = make_engine("a", clock, sleep_mode=True)
        llm.stats = False
        await engine.start()
        await engine.activate()
        _, result = await serve(engine, request("r1", messages=(SYSTEM, USER), max_out=3))
        assert result.engine is None

    virtual(body)


def test_after_a_switch_kv_is_recomputed_or_restored_from_host() -> None:
    async def scenario(clock: LoopClock, host_kv: bool) -> CallResult:
        engine, _ = make_engine("a", clock, sleep_mode=True, host_kv=host_kv)
        await engine.start()
        await engine.activate()
        _, first = await serve(engine, request("r1", messages=(SYSTEM, USER)))
        await engine.deactivate(keep_kv_on_host=True, keep_host_weight_copy=False)
        await engine.activate()
        reply = {"role": "assistant", "content": first.output.text}
        second = request("r2", messages=(SYSTEM, USER, reply, USER), call_index=1)
        _, result = await serve(engine, second)
        return result

    async def view(clock: LoopClock, host_kv: bool) -> list[dict[str, tuple[int, KvSource]]]:
        engine, _ = make_engine("a", clock, sleep_mode=True, host_kv=host_kv)
        await engine.start()
        await engine.activate()
        await serve(engine, request("r1", messages=(SYSTEM, USER)))
        before = engine.session_kv()
        await engine.deactivate(keep_kv_on_host=True, keep_host_weight_copy=False)
        return [before, engine.session_kv()]

    tokens = ByteTokenizer().encode_chat([SYSTEM, USER])
    held = len(tokens) + 12
    assert virtual(lambda clock: view(clock, False)) == [{"s1": (held, KvSource.HBM)}, {}]
    on_host = virtual(lambda clock: view(clock, True))
    assert on_host == [{"s1": (held, KvSource.HBM)}, {"s1": (held, KvSource.HOST)}]

    dropped = virtual(lambda clock: scenario(clock, host_kv=False))
    assert dropped.kv_source is KvSource.RECOMPUTE and dropped.cached_tokens == 0
    assert dropped.recomputed_tokens > 0
    restored = virtual(lambda clock: scenario(clock, host_kv=True))
    assert restored.kv_source is KvSource.HOST and restored.cached_tokens > 0
    assert restored.restored_bytes == SHAPE.kv_bytes(restored.cached_tokens)


def test_synthetic_prompts_continue_the_session() -> None:
    """Replayed calls (``prompt_tokens`` only) get ids that extend the session's context, so a
    continuation hits the prefix cache as a real agent's would."""

    async def body(clock: LoopClock) -> None:
        engine, llm = make_engine("a", clock, sleep_mode=False)
        await engine.start()
        await engine.activate()
        _, first = await serve(engine, request("r1", prompt_tokens=200))
        _, second = await serve(engine, request("r2", prompt_tokens=300, call_index=1))
        assert first.prompt_tokens == 200 and second.prompt_tokens == 300
        p1 = gens(llm)[0][4]["prompt_token_ids"]
        p2 = gens(llm)[1][4]["prompt_token_ids"]
        assert p2[:200] == p1
        assert second.cached_tokens == 208  # 200 + 12 output tokens, whole blocks
        assert second.kv_source is KvSource.HBM

    virtual(body)


def test_estimates_follow_the_rate_model() -> None:
    async def body(clock: LoopClock) -> None:
        rates = RateModel(prefill_s_per_token=1e-3, decode_step_s=0.01, decode_step_s_per_seq=0.0)
        engine, _ = make_engine("a", clock, sleep_mode=False, rates=rates)
        await engine.start()
        await engine.activate()
        assert engine.switch_in_s() == 0.0
        req = request("r1", prompt_tokens=500)
        assert engine.estimate_service_s(req, 10) == pytest.approx(0.5 + 0.1)
        await serve(engine, req)
        nxt = request("r2", prompt_tokens=600, call_index=1)
        # 512 of the 600 tokens predicted cached (500 + 12 output, whole blocks)
        assert engine.estimate_service_s(nxt, 10) == pytest.approx(88e-3 + 0.1)
        assert engine.recompute_s(1000) == pytest.approx(1.0)
        assert engine.kv_restore_s(1000) == 0.0
        assert not isinstance(engine, MemoryAccounting)  # its KV pool is vLLM's own
        assert engine.kv_shape.kv_bytes(1) == 16 * 512  # one block of 2·2 layers·2 heads·32·2 B
        assert engine.busy_s > 0

    virtual(body)


def test_prompt_longer_than_the_model_is_rejected_as_the_callers_fault() -> None:
    async def body(clock: LoopClock) -> None:
        engine, _ = make_engine("a", clock, sleep_mode=False)
        await engine.start()
        await engine.activate()
        admission = engine.try_admit(request("r1", prompt_tokens=4096), 0.0, False)
        assert admission is not None
        with pytest.raises(CallRejected, match="maximum context length is 2048") as info:
            [e async for e in engine.run(admission)]
        assert info.value.code == "context_length_exceeded" and info.value.param == "prompt"
        assert engine.running == 0

    virtual(body)


def test_early_close_aborts_and_releases() -> None:
    async def body(clock: LoopClock) -> None:
        engine, _ = make_engine("a", clock, sleep_mode=False)
        await engine.start()
        await engine.activate()
        admission = engine.try_admit(request("r1", max_out=50), 0.0, False)
        assert admission is not None
        stream = engine.run(admission)
        first = await anext(aiter(stream))
        assert isinstance(first, FirstToken)
        await stream.aclose()  # type: ignore[attr-defined]
        assert engine.running == 0 and engine.busy_s > 0

    virtual(body)


# -- CPU path ---------------------------------------------------------------------------------
def test_cpu_path_is_a_gate() -> None:
    async def body(clock: LoopClock) -> None:
        engine, llm = make_engine("a", clock, sleep_mode=False, free_bytes=1e12)
        await engine.start()
        assert await engine.activate() == 0.0
        _, first = await serve(engine, request("r1", messages=(SYSTEM, USER)))
        assert await engine.deactivate(keep_kv_on_host=False, keep_host_weight_copy=False) == 0.0
        assert not engine.start_staging() and engine.switch_in_s() == 0.0
        assert await engine.activate() == 0.0
        reply = {"role": "assistant", "content": first.output.text}
        _, second = await serve(
            engine, request("r2", messages=(SYSTEM, USER, reply, USER), call_index=1)
        )
        assert switches(llm) == []  # never slept, never woken
        assert second.kv_source is KvSource.HBM and second.cached_tokens > 0  # KV stayed

    virtual(body)


# -- through a NodeScheduler ------------------------------------------------------------------
async def agent(
    node: NodeScheduler,
    session: str,
    model: str,
    calls: int,
    gap_s: float,
    results: list[CallResult],
    start_s: float = 0.0,
    max_out: int = 20,
) -> None:
    await asyncio.sleep(start_s)
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": f"task {session}"}]
    for i in range(calls):
        req = request(
            f"{session}-{i}",
            session,
            tuple(messages),
            model=model,
            call_index=i,
            max_out=max_out,
        )
        result = await node.submit(req)
        results.append(result)
        messages += [
            {"role": "assistant", "content": result.output.text},
            {"role": "tool", "content": f"tool output {i}"},
        ]
        await asyncio.sleep(gap_s)


CALLS = 3 + 6 + 4


async def run_node(
    clock: LoopClock, flags: SchedulerFlags, sleep_mode: bool, share: float | None = None
) -> tuple[NodeScheduler, dict[str, FakeLLM], list[CallResult]]:
    """``share``: each engine's gpu_memory_utilization of an 80 GB GPU (None: unknown
    device memory)."""
    engines: dict[str, VLLMEngine] = {}
    fakes: dict[str, FakeLLM] = {}
    for name in ("a", "b"):
        engine, fake = make_engine(
            name,
            clock,
            sleep_mode=sleep_mode,
            free_bytes=5e9,
            device_bytes=None if share is None else 80e9,
            memory_share=share or 0.9,
        )
        await engine.start()  # one at a time
        engines[name], fakes[name] = engine, fake
    node = NodeScheduler(
        "node0",
        engines,
        NodeMemory(80e9, 100e9),
        clock,
        flags,
        SchedulerConfig(quantum_s=1.0, default_output_tokens=20),
    )
    node.start()
    results: list[CallResult] = []
    await asyncio.gather(
        # a long call on "a" keeps its slot busy while a short session on "a" comes back from
        # its tool calls mid-slot; "b" waits meanwhile (contention)
        agent(node, "sa1", "a", 3, 0.05, results, max_out=80),
        agent(node, "sa2", "a", 6, 0.02, results, 0.01, max_out=10),
        agent(node, "sb1", "b", 4, 0.05, results, 0.02),
    )
    await node.stop()
    for engine in engines.values():
        await engine.shutdown()
    return node, fakes, results


@pytest.mark.parametrize("sleep_mode", [False, True], ids=["cpu-gate", "gpu-sleep"])
def test_scheduler_alternates_slots_and_sp_sets_priority(sleep_mode: bool) -> None:
    # both fit together (weights unknown: 0 B), so co-residency would serve them at once
    flags = replace(TALARIA, co_residency=False)
    node, fakes, results = virtual(lambda clock: run_node(clock, flags, sleep_mode))
    models = [s.model for s in node.slots]
    switched = [m for i, m in enumerate(models) if i == 0 or m != models[i - 1]]
    assert len(switched) >= 4 and set(switched) == {"a", "b"}
    assert all(x != y for x, y in itertools.pairwise(switched))
    assert len(results) == CALLS
    sp = [r for r in results if r.sp_admitted]
    assert sp, "a continuation was admitted mid-slot (SP)"
    priorities = {g[1].split("#")[0]: g[2] for f in fakes.values() for g in gens(f)}
    for r in results:
        assert priorities[r.request_id] == vllm_priority(Priority.STANDARD, r.sp_admitted)
    assert all(r.output.text == (REPLY * 8)[: r.output_tokens] for r in results)
    assert sum(s.sp_admitted for s in node.slots) == len(sp)
    hits = [r for r in results if r.cached_tokens > 0]
    assert hits, "continuations reused their prefix"
    for model, fake in fakes.items():
        calls = switches(fake)
        if sleep_mode:
            assert all(s.switch_s > 0 for s in node.slots[1:] if s.model != "a" or s.start_s > 0)
            # started asleep; every slot of the model is a wake (maybe staged) and a sleep
            assert calls[0] == ("sleep", 1)
            assert ("wake_up", None) in calls or ("wake_up", ["kv_cache"]) in calls
            slots = sum(1 for m in switched if m == model)
            assert sum(1 for c in calls if c[0] == "sleep") >= slots
        else:
            assert calls == []


def test_co_resident_vllm_engines_serve_both_models_without_switching() -> None:
    node, fakes, results = virtual(lambda clock: run_node(clock, TALARIA, False))
    assert len(results) == CALLS
    assert [s.activated for s in node.slots][:1] in (
        [("a", "b")],
        [("b", "a")],
        [("a",)],
        [("b",)],
    )
    assert sum(len(s.activated) for s in node.slots) == 2  # two cold loads, no switch
    assert all(switches(f) == [] for f in fakes.values())


@pytest.mark.parametrize(("share", "together"), [(0.45, True), (0.9, False)])
def test_gpu_engines_are_co_resident_only_when_their_memory_shares_fit(
    share: float, together: bool
) -> None:
    """GPU path, one 80 GB device: engines at gpu_memory_utilization 0.45 each stay awake
    together (no sleep or wake after the start); at 0.9 each they take turns, each switch a
    sleep of one and a wake of the other."""
    node, fakes, results = virtual(lambda clock: run_node(clock, TALARIA, True, share))
    assert len(results) == CALLS
    activations = sum(len(s.activated) for s in node.slots)
    after_start = [c for f in fakes.values() for c in switches(f)[1:]]  # [0]: asleep at start
    if together:
        assert activations == 2 and max(len(s.co_resident) for s in node.slots) == 1
        assert all(c[0] == "wake_up" for c in after_start)  # the two cold wakes only
    else:
        assert activations > 2 and all(not s.co_resident for s in node.slots)
        assert any(c[0] == "sleep" for c in after_start)


def test_round_policy_has_no_sp_admissions() -> None:
    flags = replace(ROUND)
    node, fakes, results = virtual(lambda clock: run_node(clock, flags, False))
    assert len(results) == CALLS and not any(r.sp_admitted for r in results)
    assert all(
        g[2] == vllm_priority(Priority.STANDARD, False) for f in fakes.values() for g in gens(f)
    )
    assert len({s.model for s in node.slots}) == 2


# -- building -----------------------------------------------------------------------------------
def test_engine_args_and_factory_without_vllm() -> None:
    tiny = tiny_model_dir("tiny-llama-a")
    args = vllm_engine_args(tiny, sleep_mode=False, max_model_len=2048)
    assert args["load_format"] == "dummy" and args["enforce_eager"] is True
    assert args["skip_tokenizer_init"] and args["enable_prefix_caching"]
    assert args["scheduling_policy"] == "priority" and "enable_sleep_mode" not in args
    assert "dtype" not in args  # the model's own (bfloat16 for the tiny ones)
    gpu = vllm_engine_args(tiny, sleep_mode=True, max_model_len=4096, gpu_memory_utilization=0.5)
    assert gpu["enable_sleep_mode"] is True and "enforce_eager" not in gpu
    assert gpu["gpu_memory_utilization"] == 0.5
    emulated = vllm_engine_args(tiny, sleep_mode=False, max_model_len=2048, native_bf16=False)
    assert emulated["dtype"] == "float32"
    chosen = {"native_bf16": False, "dtype": "bfloat16"}
    assert vllm_engine_args(tiny, sleep_mode=False, max_model_len=2048, **chosen)["dtype"] == (
        "bfloat16"
    )  # the node's own choice wins

    clock = LoopClock()
    engine = build_vllm_engine(tiny, "tiny-a", clock, "node0", sleep_mode=False)
    assert engine.model == "tiny-a" and not engine.sleep_mode and not engine.started
    assert engine.kv_shape.kv_bytes(16) == 16 * 2 * 2 * 2 * 32 * 2
    b = build_vllm_engine(
        tiny_model_dir("tiny-llama-b"), "tiny-b", clock, "node0", sleep_mode=False
    )
    assert b.kv_shape.kv_bytes(16) == 16 * 2 * 3 * 2 * 32 * 2  # three layers
    with pytest.raises(FileNotFoundError):
        tiny_model_dir("nope")
    # a node TOML gives the rates as a table; the byte tokenizer keeps the output printable
    toml_like = build_vllm_engine(
        tiny, "tiny-a", clock, "node0", sleep_mode=False, rates={"prefill_s_per_token": 0.5}
    )
    assert toml_like.recompute_s(4) == 2.0
    assert toml_like._opt.sampling["allowed_token_ids"] == list(TEXT_IDS)
    assert ByteTokenizer().decode(TEXT_IDS) == "\n" + "".join(map(chr, range(32, 127)))


@pytest.mark.parametrize(
    ("cpuinfo", "native"),
    [
        ("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n", False),  # AVX2 only (Zen 3)
        ("flags\t\t: avx2 avx512f avx512_bf16\n", True),  # Zen 4, Cooper Lake
        ("flags\t\t: avx2 avx512f amx_bf16 amx_tile\n", True),  # Sapphire Rapids
        ("processor\t: 0\nFeatures\t: fp asimd\n", True),  # no x86 flags line: unknown
    ],
)
def test_native_bf16_is_read_from_the_cpu_flags(cpuinfo: str, native: bool) -> None:
    assert cpu_has_native_bf16(cpuinfo) is native


def test_kv_shape_from_config() -> None:
    cfg = {
        "num_hidden_layers": 92,
        "num_attention_heads": 96,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_size": 5120,
        "torch_dtype": "bfloat16",
    }
    shape = KvShape.from_config(cfg, tensor_parallel_size=8)
    assert shape.bytes_per_token == 2 * 92 * 8 * 128 * 2
    fp8 = KvShape.from_config(cfg, kv_cache_dtype="fp8_e4m3")
    assert fp8.bytes_per_token == shape.bytes_per_token // 2
    replicated = KvShape.from_config({**cfg, "num_key_value_heads": 4}, tensor_parallel_size=8)
    assert replicated.bytes_per_token == 2 * 92 * 8 * 128 * 2  # one head per GPU, replicated
    assert shape.kv_bytes(1) == shape.kv_bytes(16) == 16 * shape.bytes_per_token


def test_the_node_status_lists_the_sessions_whose_kv_a_vllm_engine_holds() -> None:
    async def body(clock: LoopClock) -> None:
        node, _, _ = await run_node(clock, TALARIA, sleep_mode=False)
        sessions = node.status().sessions
        assert {sid: s.model for sid, s in sessions.items()} == {
            "sa1": "a",
            "sa2": "a",
            "sb1": "b",
        }
        for sid, entry in sessions.items():
            engine = node.engines[entry.model]
            tokens, source = engine.session_kv()[sid]
            assert (entry.location, entry.tokens, entry.restore_s) == ("hbm", tokens, 0.0)
            assert source is KvSource.HBM and tokens > 0
        node.end_session("sa2")
        assert set(node.status().sessions) == {"sa1", "sb1"}  # an ended session is not listed

    virtual(body)
