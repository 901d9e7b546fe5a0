"""The tiny hand-built node the scheduler scenarios run on, and their harness (shared by
test_scheduler_scenarios.py, test_learned_gaps_node.py, test_demand_coresidency.py and
tests/unit/core/test_gap_model.py).

Catalog (built here, not loaded): one GPU ("tiny" server) and two identical dense bf16 models
"a" and "b", so every figure below is a round number:

- weights 40 GB each; usable HBM 100 GB. The scheduler never keeps two models active (a
  switch always puts the outgoing one to sleep), but the active model plus the other one
  staged (80 GB) fit, leaving 20 GB of KV. KV is 1 MB per token (2 × 50 layers × 50 heads ×
  100 dims × 2 B).
- wake (host → HBM) at 10 GB/s: 4 s; sleep (HBM → host) at 20 GB/s: 2 s; so a plain switch is
  2 + 4 = 6 s. Device copy of staged weights: 2 × 40 GB / 1 TB/s = 0.08 s. KV over PCIe at
  10 GB/s: 0.1 ms per token.
- steps: 10 ms overhead + max(compute, memory); decode is memory-bound, 40 ms of weights +
  1 µs per context token, so a decode step is ≈ 51 ms at 1,000 tokens of context.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest

from talaria.core.catalog import Catalog
from talaria.core.clock import LoopClock, VirtualTimeDeadlock, VirtualTimeLoop
from talaria.core.efficiency_profile import EfficiencyProfile
from talaria.core.model_spec import ModelSpec
from talaria.core.server_spec import ServerSpec
from talaria.core.status import InstanceStatus
from talaria.core.types import CallRequest, CallResult
from talaria.runtime.costmodel import CostModel
from talaria.runtime.scheduling.calls import UnknownModelError
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import SchedulerFlags
from talaria.runtime.scheduling.intake import CallTooLargeError
from talaria.runtime.scheduling.node import NodeScheduler
from talaria.sim.replay import NodeSetup, build_node

WEIGHTS = 40e9


def tiny_model(name: str) -> ModelSpec:
    return ModelSpec(
        name=name,
        hf_id=f"test/{name}",
        total_params=20e9,
        active_params=20e9,
        layers=50,
        q_heads=50,
        kv_heads=50,
        head_dim=100,
        weight_dtype="bf16",
        weight_bytes=WEIGHTS,
        kv_bytes_per_token=1_000_000,
        kv_bytes_per_token_tp8=1_000_000,
        context_window_tokens=131_072,
    )


SERVER = ServerSpec(
    name="tiny",
    gpus=1,
    hbm_bytes_per_gpu=100e9,
    hbm_bytes_per_s_per_gpu=1e12,
    dense_flops_per_s_per_gpu={"bf16": 1e15, "fp8": 2e15},
    pcie_peak_bytes_per_s_per_gpu=10e9,
    pcie_pinned_bytes_per_s_per_gpu=10e9,
    nvlink_bytes_per_s_per_gpu=100e9,
    host_dram_bytes=1e12,
    weight_wake_bytes_per_s_per_gpu=10e9,
    weight_sleep_bytes_per_s_per_gpu=20e9,
    gpu_memory_utilization=1.0,
)
PROFILE = EfficiencyProfile(
    name="tiny", compute_efficiency=1.0, memory_efficiency=1.0, step_overhead_s=0.01
)
CATALOG = Catalog(
    models={"a": tiny_model("a"), "b": tiny_model("b")},
    servers={"tiny": SERVER},
    profiles={"tiny": PROFILE},
)
SETUP = NodeSetup("tiny", "tiny", ("a", "b"))
COST_A = CostModel(CATALOG.model("a"), SERVER, PROFILE)
COST_B = CostModel(CATALOG.model("b"), SERVER, PROFILE)
QUANTUM_S = 30.0

SP_SOFT = SchedulerFlags(sp_admission=True, soft_reservations=True)
LEARNED = replace(SP_SOFT, learned_gaps=True)

# A two-call session: call 0 has a P0-token prompt and OUT output tokens; call 1 appends
# APPEND tokens of tool output to call 0's prompt + output.
P0, OUT, APPEND = 1000, 10, 90
SHARED = P0 + OUT  # 1010 tokens of call 1's prompt are call 0's prompt + output
P1 = SHARED + APPEND  # 1100
CACHED = SHARED - SHARED % PROFILE.block_tokens  # 1008: only whole 16-token blocks are reused
GAP = 0.5


# -- harness ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    prompt: int
    output: int
    gap_s: float | None = None
    """Tool time the agent spends after this call's answer."""
    hint_s: float | None = None
    """``expected_tool_gap_s`` sent with the call."""


@dataclass(frozen=True)
class Agent:
    session: str
    model: str
    start_s: float
    calls: tuple[Call, ...]
    ends: bool = True
    """The last call carries ``session_final``."""


Outcome = list[CallResult | Exception]


def _requests(agent: Agent) -> list[CallRequest]:
    out: list[CallRequest] = []
    previous = 0  # append-only history: the shared prefix is the last prompt + output
    for i, call in enumerate(agent.calls):
        out.append(
            CallRequest(
                request_id=f"{agent.session}/{i}",
                session_key=agent.session,
                model=agent.model,
                prompt_tokens=call.prompt,
                max_output_tokens=call.output,
                call_index=i,
                expected_tool_gap_s=call.hint_s,
                session_final=agent.ends and i == len(agent.calls) - 1,
                shared_prefix_tokens=previous,
            )
        )
        previous = call.prompt + call.output
    return out


def run_scenario(
    flags: SchedulerFlags,
    agents: Sequence[Agent],
    quantum_s: float = QUANTUM_S,
    gap_quantile: float | None = None,
) -> tuple[NodeScheduler, dict[str, Outcome]]:
    """Run the agents closed-loop against one node; a failed call ends its session
    (``gap_quantile``: the node's, for ``learned_gaps``; None: the default)."""
    node, outcomes, _ = run_probed(flags, agents, (), quantum_s, gap_quantile)
    return node, outcomes


def run_probed(
    flags: SchedulerFlags,
    agents: Sequence[Agent],
    probe_at: Sequence[float],
    quantum_s: float = QUANTUM_S,
    gap_quantile: float | None = None,
) -> tuple[NodeScheduler, dict[str, Outcome], list[InstanceStatus]]:
    """``run_scenario``, plus the node's status at each time of ``probe_at`` and once more
    when every agent is done (last)."""

    async def main() -> tuple[NodeScheduler, dict[str, Outcome], list[InstanceStatus]]:
        clock = LoopClock()
        config = SchedulerConfig(quantum_s=quantum_s)
        if gap_quantile is not None:
            config = replace(config, gap_quantile=gap_quantile)
        node = build_node("n0", SETUP, CATALOG, flags, config, clock)
        node.start()

        async def run_agent(agent: Agent) -> Outcome:
            await clock.sleep(agent.start_s - clock.now())
            results: Outcome = []
            for call, request in zip(agent.calls, _requests(agent), strict=True):
                try:
                    results.append(await node.submit(request))
                except (CallTooLargeError, UnknownModelError) as exc:
                    results.append(exc)
                    break
                if call.gap_s is not None:
                    await clock.sleep(call.gap_s)
            return results

        async def probe() -> list[InstanceStatus]:
            statuses = []
            for t in probe_at:
                await clock.sleep(t - clock.now())
                statuses.append(node.status())
            return statuses

        probing = asyncio.ensure_future(probe())
        try:
            outcomes = await asyncio.gather(*(run_agent(a) for a in agents))
            statuses = await probing
            statuses.append(node.status())
        finally:
            await node.stop()  # also retrieves the loop task's exception if it crashed
        return node, {a.session: o for a, o in zip(agents, outcomes, strict=True)}, statuses

    # run_virtual, plus: when the run deadlocks (a regression), cancel what is left so that
    # no pending task is garbage-collected later, in the middle of another test.
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        cancel_leftovers(loop)
        loop.close()


def cancel_leftovers(loop: VirtualTimeLoop) -> None:
    for _ in range(10):
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        if not pending:
            return
        for task in pending:
            task.cancel()
        # a task may swallow one cancel (see test_stop_right_after_the_last_call): try again
        with contextlib.suppress(VirtualTimeDeadlock):
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    raise AssertionError("tasks left pending after cancelling them 10 times")


def ok(outcome: Outcome, index: int) -> CallResult:
    result = outcome[index]
    assert isinstance(result, CallResult), result
    return result


def lone_call_s(cost: CostModel, prompt: int, output: int, cached: int = 0) -> float:
    """A call alone on its engine: prefill the uncached part (the step samples token 1), then
    output − 1 decode steps of batch 1."""
    return cost.prefill_time_s(prompt - cached, cached) + cost.decode_time_s(output - 1, prompt, 1)


def plain_switch_s(outgoing: CostModel, incoming: CostModel) -> float:
    """Sleep the outgoing model's weights to host, then wake the incoming one's."""
    return outgoing.weight_sleep_time_s() + incoming.weight_wake_time_s()


def approx(x: float) -> object:
    return pytest.approx(x, rel=0, abs=1e-9)


TWO_CALLS_A = Agent("s1", "a", 0.0, (Call(P0, OUT, gap_s=GAP), Call(P1, OUT)))
ONE_CALL_B = Agent("s2", "b", 0.0, (Call(P0, OUT),))
