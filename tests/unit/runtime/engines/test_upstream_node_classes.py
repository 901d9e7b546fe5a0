"""The fair queue in front of an upstream server (issue 49, part 4): a node of one
``engine = "openai"`` model on a fake server (tests/fake_upstream.py), built from a node config
as ``talaria runtime`` builds it. Where the server's rates say one more running call slows a
decode step past ``class_slowdown`` (20 ms + 10 ms a call beyond the first: 30 ms > 1.2 ×
20 ms), the fair queue (``talaria``) keeps a batch call that arrives while an interactive call
streams out of the server until that call ends (fairness.py rule 4); where they say it does
not (21 ms), or without the fair queue (``-fair_queue``), the batch call goes to the server at
once. Each request carries its class as the server's priority (``priority = "vllm"``). Each
call is its session's last (a session expected back after its tool call would keep the batch
call out longer: rule 4 counts it)."""

from __future__ import annotations

import asyncio

import pytest

from talaria.core.calls import Call
from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock
from talaria.core.types import CallRequest, CallResult, Priority
from talaria.runtime.config import ModelConfig, NodeConfig
from talaria.runtime.factory import build_node_from_config
from tests.fake_upstream import FakeUpstream

SLOWED = {"decode_step_s": 0.02, "decode_step_s_per_seq": 0.01}
"""One more call: a 30 ms step, past 1.2 × 20 ms."""
WITHIN = {"decode_step_s": 0.02, "decode_step_s_per_seq": 0.001}
"""One more call: a 21 ms step, within 1.2 × 20 ms."""


def _request(session: str, text: str, priority: Priority) -> CallRequest:
    call = Call("a", messages=({"role": "user", "content": text},), max_output_tokens=256)
    return CallRequest(
        f"{session}-0", session, "a", call.prompt_tokens(), 256, call=call, priority=priority,
        session_final=True,
    )  # fmt: skip


async def _run(policy: str, rates: dict[str, float]) -> tuple[CallResult, CallResult, list[int]]:
    fake = FakeUpstream(model="a", slow_chunks=40)  # "slow": 40 chunks 20 ms apart
    await fake.start()
    options = {"url": fake.url + "/v1", "priority": "vllm", "rates": rates}
    config = NodeConfig("up-node", (ModelConfig("a", "openai", options=options),), policy=policy)
    built = build_node_from_config(config, load_catalog(), LoopClock())
    engine = built.engines["a"]
    await engine.start()
    node = built.node
    node.start()
    try:
        interactive = asyncio.create_task(
            node.submit(_request("ide", "slow", Priority.INTERACTIVE))
        )
        while not fake.bodies:  # the interactive call is on the server
            await asyncio.sleep(0.01)
        batch = await node.submit(_request("bulk", "hello", Priority.BATCH))
        first = await interactive
    finally:
        await node.stop()
        await engine.shutdown()
        await fake.stop()
    return first, batch, [b["priority"] for b in fake.bodies]


@pytest.mark.parametrize(
    ("policy", "rates", "held"),
    [("talaria", SLOWED, True), ("talaria", WITHIN, False), ("-fair_queue", SLOWED, False)],
)
def test_a_batch_call_waits_out_an_interactive_one_it_would_slow(
    policy: str, rates: dict[str, float], held: bool
) -> None:
    """Held only by the fair queue's bound on the interactive call's decode step."""
    first, batch, priorities = asyncio.run(_run(policy, rates))
    assert (batch.admitted_s >= first.finished_s) is held
    assert priorities == [1, 5]  # interactive, then batch: vLLM's lower-first values
