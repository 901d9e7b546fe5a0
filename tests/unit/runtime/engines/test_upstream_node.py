"""A node of two ``engine = "openai"`` models on two fake servers (tests/fake_upstream.py)
with sleep endpoints, built from a node config as ``talaria runtime`` builds it: the slot
switch sleeps the outgoing server and wakes the incoming one (vLLM's or SGLang's endpoints),
the fakes' shared log shows the wakes in the slot order, a wake before each server's calls and
one server awake at a time when memory says so; SP admission still admits continuations
mid-slot."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from talaria.core.calls import Call
from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock
from talaria.core.types import CallRequest, CallResult, KvSource
from talaria.runtime.config import ModelConfig, NodeConfig
from talaria.runtime.engines.upstream import UpstreamEngine
from talaria.runtime.factory import build_node_from_config
from talaria.runtime.scheduling.node import NodeScheduler
from tests.fake_upstream import FakeUpstream

Log = list[tuple[str, str, str]]
SLEEPS = ("/sleep", "/release_memory_occupation")
WAKES = ("/wake_up", "/resume_memory_occupation")


async def agent(
    node: NodeScheduler, session: str, model: str, texts: list[str], delay_s: float,
    gap_s: float, results: list[CallResult],
) -> None:  # fmt: skip
    await asyncio.sleep(delay_s)
    messages: list[dict[str, Any]] = []
    for i, text in enumerate(texts):
        messages.append({"role": "user", "content": text})
        call = Call(model, messages=tuple(messages), max_output_tokens=16)
        request = CallRequest(f"{session}-{i}", session, model, call.prompt_tokens(), 16, call=call)
        result = await node.submit(request)
        results.append(result)
        assert result.output is not None
        messages.append(result.output.as_message())
        await asyncio.sleep(gap_s)


async def run_node(
    sleep: str, policy: str, weight_bytes: float | None
) -> tuple[NodeScheduler, Log, list[CallResult]]:
    shared: Log = []
    fakes = {m: FakeUpstream(model=m, slow_chunks=40, shared=shared) for m in ("a", "b")}
    for fake in fakes.values():
        await fake.start()
    extra = {} if weight_bytes is None else {"weight_bytes": weight_bytes, "device_bytes": 80e9}
    models = tuple(
        ModelConfig(m, "openai", options={"url": f.url + "/v1", "sleep": sleep, **extra})
        for m, f in fakes.items()
    )
    config = NodeConfig("up-node", models, policy=policy, quantum_s=0.5)
    built = build_node_from_config(config, load_catalog(), LoopClock())
    assert all(isinstance(e, UpstreamEngine) for e in built.engines.values())
    for engine in built.engines.values():
        await engine.start()  # one at a time
    node = built.node
    node.start()
    results: list[CallResult] = []
    try:
        await asyncio.gather(
            # a long call keeps a's slot busy while a short session on a comes back from its
            # tool calls mid-slot; b waits meanwhile (contention)
            agent(node, "sa1", "a", ["slow"], 0.0, 0.0, results),
            agent(node, "sa2", "a", [f"step {i}" for i in range(5)], 0.0, 0.15, results),
            agent(node, "sb1", "b", [f"go {i}" for i in range(3)], 0.1, 0.03, results),
        )
    finally:
        await node.stop()
        for engine in built.engines.values():
            await engine.shutdown()
        for fake in fakes.values():
            await fake.stop()
    return node, shared, results


def check_one_awake_and_wake_before_calls(shared: Log) -> None:
    awake = {"a", "b"}  # the fakes start awake; each engine's start puts its server to sleep
    started = False
    for model, _method, path in shared:
        if path.startswith(SLEEPS):
            awake.discard(model)
        elif path.startswith(WAKES) and "tags=weights" not in path:
            started = True
            awake.add(model)
            assert len(awake) == 1, f"{sorted(awake)} awake together"
        elif path == "/v1/chat/completions":
            assert started and model in awake, f"a call of {model} reached it asleep"


@pytest.mark.parametrize(
    ("sleep", "policy", "weight_bytes"),
    [("vllm", "-co_residency", None), ("sglang", "-co_residency", None),
     ("vllm", "talaria", 60e9)],
    ids=["vllm-one-at-a-time", "sglang-one-at-a-time", "vllm-memory-says-one"],
)  # fmt: skip
def test_slot_switches_sleep_and_wake_the_servers_in_slot_order(
    sleep: str, policy: str, weight_bytes: float | None
) -> None:
    node, shared, results = asyncio.run(run_node(sleep, policy, weight_bytes))
    assert len(results) == 9
    for r in results:
        assert r.output is not None
        if r.request_id != "sa1-0":
            assert r.output.text == f"Hello from {r.model}."
    check_one_awake_and_wake_before_calls(shared)
    wakes = [m for m, _, p in shared if p.startswith(WAKES)]
    assert wakes == [m for s in node.slots for m in s.activated]
    assert len(wakes) >= 3 and set(wakes) == {"a", "b"}  # switched back and forth
    sleeps = [m for m, _, p in shared if p.startswith(SLEEPS)]
    assert sleeps[:2] in (["a", "b"], ["b", "a"]) or sleep == "vllm"  # started asleep
    assert any(r.sp_admitted for r in results), "a continuation was admitted mid-slot (SP)"
    assert any(r.kv_source is KvSource.HBM for r in results), "continuations hit its cache"
    # a vLLM server is salted per tenant and shows its cached tokens; SGLang's are hidden
    assert any(r.cached_tokens > 0 for r in results) is (sleep == "vllm")


def test_servers_whose_memory_fits_together_stay_awake_together() -> None:
    node, shared, results = asyncio.run(run_node("vllm", "talaria", 30e9))
    assert len(results) == 9
    after_start = [(m, p) for m, _, p in shared if p.startswith(WAKES + SLEEPS)][2:]
    assert sorted(after_start) == [("a", "/wake_up"), ("b", "/wake_up")]  # two cold wakes
    assert sum(len(s.activated) for s in node.slots) == 2
