"""VLLMEngine on real vLLM (the CPU build): the tiny random-weight models of runtime/models/.

Run with the vLLM venv: ``bash scripts/vllm-venv.sh && .venv-vllm/bin/python -m pytest -m vllm
tests/vllm``. Starting an engine takes ~20 s, so one module-scoped pair of engines (tiny-llama-a
and tiny-llama-b, started one at a time) serves every test here, on one event loop.

On the CPU backend there is no sleep mode: switching is the engine's logical gate (0 s), so
these tests check real tokens, real prefix-cache hits and the scheduler's decisions with real
engines, not switch costs.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import replace
from typing import Any, TypeVar

import pytest

pytest.importorskip("vllm")

from talaria.core.calls import Call
from talaria.core.clock import LoopClock
from talaria.core.types import (
    CallRequest,
    CallResult,
    Finished,
    FirstToken,
    KvSource,
    Priority,
    TokenDelta,
)
from talaria.runtime.engines.tokenizer import ByteTokenizer
from talaria.runtime.engines.vllm import (
    VLLMEngine,
    build_vllm_engine,
    tiny_model_dir,
    vllm_priority,
)
from talaria.runtime.memory.resources import NodeMemory
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import TALARIA, SchedulerFlags
from talaria.runtime.scheduling.node import NodeScheduler
from tests.vllm.holds import held_for_an_interactive_call

pytestmark = pytest.mark.vllm

T = TypeVar("T")
SYSTEM = {
    "role": "system",
    "content": "You are a careful software engineering agent. Read before you edit. " * 4,
}


class Recorder:
    """Wraps the real AsyncLLM and records each generate call's request id, priority, prompt
    and output limit."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.priorities: dict[str, int] = {}
        self.submissions: dict[str, list[tuple[list[int], int]]] = {}
        """Per call (request id before ``#``): each submission's prompt ids and max_tokens."""

    def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, *, priority: int = 0
    ) -> AsyncIterator[Any]:
        self.priorities[request_id.split("#")[0]] = priority
        self.submissions.setdefault(request_id.split("#")[0], []).append(
            (list(prompt["prompt_token_ids"]), sampling_params.max_tokens)
        )
        stream: AsyncIterator[Any] = self.llm.generate(
            prompt, sampling_params, request_id=request_id, priority=priority
        )
        return stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self.llm, name)


class Node:
    """The module's event loop and its two started engines."""

    def __init__(self) -> None:
        self.runner = asyncio.Runner()
        self.clock = LoopClock()
        self.engines: dict[str, VLLMEngine] = {}
        self.recorders: dict[str, Recorder] = {}
        self.start_s: dict[str, float] = {}

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    async def start(self) -> None:
        for name in ("tiny-llama-a", "tiny-llama-b"):
            engine = build_vllm_engine(
                tiny_model_dir(name), name, self.clock, "cpu0", max_model_len=2048
            )
            assert not engine.sleep_mode  # the CPU backend has no sleep mode: the gate
            t0 = time.perf_counter()
            await engine.start()  # one at a time
            self.start_s[name] = time.perf_counter() - t0
            recorder = Recorder(engine._llm)
            engine._llm = recorder
            self.engines[name] = engine
            self.recorders[name] = recorder

    async def stop(self) -> None:
        for name, engine in self.engines.items():
            engine._llm = self.recorders[name].llm  # shut the AsyncLLM itself down
            await engine.shutdown()


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    node = Node()
    try:
        node.run(node.start())
        print(f"engine start: {node.start_s}")
        yield node
    finally:
        node.run(node.stop())
        node.runner.close()
        node.recorders.clear()  # drop the last references to the AsyncLLMs now
        node.engines.clear()
        gc.collect()


def call(
    rid: str,
    session: str,
    messages: list[dict[str, Any]],
    *,
    model: str = "tiny-llama-a",
    index: int = 0,
    max_out: int = 16,
    stream: bool = False,
) -> CallRequest:
    return CallRequest(
        request_id=rid,
        session_key=session,
        model=model,
        prompt_tokens=len(str(messages)) // 4,
        max_output_tokens=max_out,
        call_index=index,
        stream=stream,
        call=Call(model, messages=tuple(messages)),
    )


def test_real_tokens_and_prefix_cache_hits(node: Node) -> None:
    engine = node.engines["tiny-llama-a"]
    tok = ByteTokenizer()

    messages = [SYSTEM, {"role": "user", "content": "Fix the failing test."}]
    prompt_ids = tok.encode_chat(messages)

    async def body() -> tuple[list[Any], CallResult, list[Any]]:
        # the CPU gate: no await, ~0 s (0.1 s: a loaded box may deschedule the test between the
        # clock's two reads; a wake through vLLM's sleep mode waits on the EngineCore process)
        assert await engine.activate() < 0.1
        history = list(messages)
        first = call("real-1", "real", history, stream=True)
        admission = engine.try_admit(first, node.clock.now(), False)
        assert admission is not None
        events = [e async for e in engine.run(admission)]
        result = events[-1].result
        history += [
            {"role": "assistant", "content": result.output.text},
            {"role": "tool", "content": "1 failed, 3 passed"},
        ]
        second = call("real-2", "real", history, index=1)
        admission = engine.try_admit(second, node.clock.now(), False)
        assert admission is not None
        more = [e async for e in engine.run(admission)]
        await engine.deactivate(keep_kv_on_host=False, keep_host_weight_copy=False)
        return events, result, more

    events, result, more = node.run(body())
    head, *deltas, done = events
    assert isinstance(head, FirstToken) and isinstance(done, Finished)
    assert head.kv_source is KvSource.NEW and head.cached_tokens == 0
    assert all(isinstance(d, TokenDelta) for d in deltas)
    assert result.output_tokens == 16 == 1 + sum(d.tokens for d in deltas)
    assert result.prompt_tokens == len(prompt_ids) > 128  # over one CPU KV block
    assert (
        result.output.text
        and head.delta.text + "".join(d.delta.text for d in deltas) == result.output.text
    )
    assert result.first_token_s <= result.finished_s
    # vLLM's own EngineCore timestamps, on the runtime's clock: in order, inside the call, and
    # the host passes each output on within milliseconds (2 s: the EngineCore process and
    # another worker's share the 2 cores; a timestamp left on another clock is off by far more)
    times = result.engine
    assert times is not None
    assert result.admitted_s <= times.queued_s <= times.scheduled_s <= times.first_token_s
    assert times.first_token_s <= times.last_token_s <= result.finished_s
    assert 0 <= result.first_token_s - times.first_token_s < 2.0
    assert 0 <= result.finished_s - times.last_token_s < 2.0

    first_token, finished = more
    assert isinstance(first_token, FirstToken) and isinstance(finished, Finished)
    second = finished.result
    print(f"continuation: {second.cached_tokens} of {second.prompt_tokens} tokens cached")
    assert second.cached_tokens > 0 and second.cached_tokens == first_token.cached_tokens
    block = 128  # the CPU backend's KV block
    context = result.prompt_tokens + result.output_tokens  # the output round-trips
    assert second.cached_tokens == (context - 1) // block * block  # whole computed blocks
    assert second.kv_source is KvSource.HBM
    assert node.recorders["tiny-llama-a"].priorities["real-2"] == vllm_priority(
        Priority.STANDARD, False
    )


async def agent(
    sched: NodeScheduler,
    session: str,
    model: str,
    calls: int,
    max_out: int,
    gap_s: float,
    results: list[CallResult],
    start_s: float = 0.0,
    priority: Priority = Priority.STANDARD,
) -> None:
    await asyncio.sleep(start_s)
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": f"task {session}"}]
    for i in range(calls):
        req = call(f"{session}-{i}", session, messages, model=model, index=i, max_out=max_out)
        req = replace(req, priority=priority)
        result = await sched.submit(req)
        results.append(result)
        messages += [
            {"role": "assistant", "content": result.output.text},
            {"role": "tool", "content": f"tool output {i}"},
        ]
        await asyncio.sleep(gap_s)


def _scheduler(node: Node, flags: SchedulerFlags) -> NodeScheduler:
    """A scheduler over the module's two started engines (2 s quantum)."""
    return NodeScheduler(
        "cpu0",
        node.engines,
        NodeMemory(64e9, 64e9),
        node.clock,
        flags,
        SchedulerConfig(quantum_s=2.0, default_output_tokens=16),
    )


SWITCHING = replace(TALARIA, co_residency=False, demand_slots=False, fair_queue=False)
"""The four original flags (round-robin slots, one model resident at a time): slots alternate
between the two models in order, whatever the calls' classes."""


def test_two_engines_alternate_slots_with_sp_admission(node: Node) -> None:
    """A long call keeps tiny-llama-a's slot busy while a short session on it comes back from
    its tools (continuations, SP-admitted mid-slot); tiny-llama-b waits meanwhile."""
    a, b = "tiny-llama-a", "tiny-llama-b"

    async def body() -> tuple[NodeScheduler, list[CallResult]]:
        sched = _scheduler(node, SWITCHING)
        sched.start()
        results: list[CallResult] = []
        try:
            await asyncio.wait_for(
                asyncio.gather(
                    agent(sched, "long", a, 2, 400, 0.05, results, 0.0, Priority.BATCH),
                    agent(sched, "short", a, 5, 8, 0.02, results, 0.05, Priority.INTERACTIVE),
                    agent(sched, "other", b, 3, 16, 0.05, results, 0.1),
                ),
                timeout=240,
            )
        finally:
            await sched.stop()
        return sched, results

    t0 = time.perf_counter()
    sched, results = node.run(body())
    print(f"scheduler run: {time.perf_counter() - t0:.1f} s")
    for slot in sched.slots:
        print(slot)
    assert len(results) == 10
    models = [s.model for s in sched.slots]
    switched = [m for i, m in enumerate(models) if i == 0 or m != models[i - 1]]
    assert switched[:3] == [a, b, a], switched
    sp = [r for r in results if r.sp_admitted]
    assert sp, "a continuation of the short session was admitted mid-slot (SP)"
    assert all(r.session_key == "short" and r.model == a for r in sp)
    priorities = {**node.recorders[a].priorities, **node.recorders[b].priorities}
    classes = {"long": Priority.BATCH, "short": Priority.INTERACTIVE, "other": Priority.STANDARD}
    for r in results:  # what vLLM's priority scheduler got: the class, then SP first within it
        assert priorities[r.request_id] == vllm_priority(classes[r.session_key], r.sp_admitted)
    for r in sorted(results, key=lambda r: r.arrival_s):
        print(r.request_id, f"queue {r.queue_s:.3f} s", r.sp_admitted, r.cached_tokens, r.kv_source)
    other = next(r for r in results if r.request_id == "other-0")
    assert other.queue_s > 0  # it waited for b's slot
    continuations = [r for r in results if not r.request_id.endswith("-0")]
    assert all(r.cached_tokens > 0 and r.kv_source is KvSource.HBM for r in continuations)
    wanted = {"long": 400, "short": 8, "other": 16}
    assert all(r.output_tokens == wanted[r.session_key] and r.output.text for r in results)


def test_two_co_resident_engines_serve_at_once(node: Node) -> None:
    """Talaria's scheduler (co-residency): both CPU engines stay resident, so tiny-llama-b's
    call runs while tiny-llama-a's long one decodes, with no switch after the two activations."""
    a, b = "tiny-llama-a", "tiny-llama-b"

    async def body() -> tuple[NodeScheduler, list[CallResult]]:
        sched = _scheduler(node, TALARIA)
        sched.start()
        results: list[CallResult] = []
        try:
            await asyncio.wait_for(
                asyncio.gather(
                    agent(sched, "co-long", a, 1, 300, 0.0, results),
                    agent(sched, "co-short", b, 2, 16, 0.05, results, 0.2),
                ),
                timeout=240,
            )
        finally:
            await sched.stop()
        return sched, results

    sched, results = node.run(body())
    long = next(r for r in results if r.session_key == "co-long")
    short = [r for r in results if r.session_key == "co-short"]
    assert len(short) == 2
    assert all(long.first_token_s < r.admitted_s and r.finished_s < long.finished_s for r in short)
    assert sum(len(s.activated) for s in sched.slots) <= 2  # cold activations only


def _batch_call(i: int) -> CallRequest:
    messages = [SYSTEM, {"role": "user", "content": f"batch job {i}"}]
    return replace(
        call(f"held-{i}", f"held-{i}", messages, max_out=64, stream=True), priority=Priority.BATCH
    )


def test_batch_calls_held_for_an_interactive_one_resume_whole(node: Node) -> None:
    """The fair queue's rule 5 on real vLLM (runtime/engines/class_holds.py): with no slowdown
    allowed, two batch calls decoding are aborted when an interactive call enters, and
    resubmitted as prompt + output so far once it has finished; each still gives all its
    tokens, and its streamed pieces add up to its text."""
    engine = node.engines["tiny-llama-a"]
    recorder = node.recorders["tiny-llama-a"]

    async def body() -> tuple[int, list[Any], list[list[Any]]]:
        await engine.activate()
        ide = replace(
            call("ide", "ide", [SYSTEM, {"role": "user", "content": "quick"}], max_out=8),
            priority=Priority.INTERACTIVE,
        )
        try:
            return await held_for_an_interactive_call(
                engine, node.clock, [_batch_call(i) for i in range(2)], ide
            )
        finally:
            await engine.deactivate(keep_kv_on_host=False, keep_host_weight_copy=False)

    preemptions, ide_events, bulk_events = node.run(body())
    assert preemptions == 2
    ide_done = ide_events[-1].result
    for i, events in enumerate(bulk_events):
        head, *deltas, done = events
        assert isinstance(head, FirstToken) and isinstance(done, Finished)
        result = done.result
        assert result.output_tokens == 64 and result.output.finish_reason == "length"
        assert head.delta.text + "".join(d.delta.text for d in deltas) == result.output.text
        assert ide_done.finished_s < result.finished_s
        (first, first_max), (again, again_max), *more = recorder.submissions[f"held-{i}"]
        assert not more and first_max == 64
        done_before = len(again) - len(first)  # the output so far went back in with the prompt
        assert again[: len(first)] == first and 0 < done_before < 64
        assert again_max == 64 - done_before
