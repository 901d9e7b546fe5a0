"""The simulated engine timed by a calibrated ``StepFit``: exact times on the virtual clock,
including the call intake and the idle wake-up ladder."""

from __future__ import annotations

import pytest

from talaria.core.catalog import load_catalog
from talaria.core.efficiency_profile import EfficiencyProfile, StepFit
from talaria.core.trace import SessionTrace, TraceCall
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import policy_flags
from talaria.runtime.sim_node import NodeSetup
from talaria.sim.replay import replay

FIT = StepFit(
    overhead_s=3e-3,
    s_per_token=1e-5,
    s_per_pair=4e-9,
    s_per_seq=1e-4,
    call_overhead_s=2e-3,
    idle_wake=((0.0, 0.0), (0.1, 0.008), (1.0, 0.026)),
)
GAPS = (0.05, 0.5, 5.0)


def _session() -> SessionTrace:
    calls = []
    prompt, new = 300, 300
    for i, gap in enumerate((*GAPS, None)):
        calls.append(TraceCall("s", i, "tiny-a", 0.0, prompt, new, 20, gap))
        new = 50
        prompt += 20 + new
    return SessionTrace("s", "tiny-a", 0.0, tuple(calls))


@pytest.mark.parametrize("policy", ["talaria", "round"])
def test_each_call_pays_intake_plus_the_wake_up_for_the_idle_time_before_it(policy: str) -> None:
    catalog = load_catalog()
    catalog.profiles["cal"] = EfficiencyProfile(
        name="cal", max_num_batched_tokens=2048, block_tokens=128, fitted={"tiny-a": FIT}
    )
    layout = [("node0", NodeSetup("cpu-vllm", "cal", ("tiny-a",)))]
    session = _session()
    outcome = replay([session], catalog, layout, policy_flags(policy), SchedulerConfig(5.0))
    results = outcome.sessions[0].calls
    previous_context = 0
    for i, (call, result) in enumerate(zip(session.calls, results, strict=True)):
        idle = 1e9 if i == 0 else GAPS[i - 1]  # the engine idles through each tool gap
        cached = min(previous_context, call.prompt_tokens - 1) // 128 * 128
        n = call.prompt_tokens - cached
        step = FIT.step_time_s(n, n * cached + n * n / 2, 1)
        expected = FIT.call_overhead_s + FIT.wake_s(idle) + step
        assert result.cached_tokens == cached
        assert result.first_token_s - result.admitted_s == pytest.approx(expected, abs=1e-6)
        previous_context = call.prompt_tokens + call.output_tokens
    waits = [r.first_token_s - r.admitted_s for r in results]
    assert waits[2] > waits[1]  # 0.5 s idle costs more than 0.05 s


def test_a_step_of_a_token_count_the_engine_has_not_run_pays_the_new_shape_cost_once() -> None:
    """Two sessions whose first calls prefill the same 300 tokens, then one of 301: the first
    and the third step each run a new shape; the second repeats the first's."""
    shaped = StepFit(3e-3, 1e-5, 4e-9, 1e-4, 2e-3, new_shape_s=0.01)
    catalog = load_catalog()
    catalog.profiles["cal"] = EfficiencyProfile(
        name="cal", max_num_batched_tokens=2048, block_tokens=128, fitted={"tiny-a": shaped}
    )
    layout = [("node0", NodeSetup("cpu-vllm", "cal", ("tiny-a",)))]
    sessions = [
        SessionTrace(sid, "tiny-a", start, (TraceCall(sid, 0, "tiny-a", start, n, n, 1, None),))
        for sid, start, n in (("a", 0.0, 300), ("b", 1.0, 300), ("c", 2.0, 301))
    ]
    outcome = replay(sessions, catalog, layout, policy_flags("talaria"), SchedulerConfig(5.0))
    steps = {}
    for session in outcome.sessions:
        (result,) = session.calls
        assert result.engine is not None
        steps[session.session_id] = result.engine.first_token_s - result.engine.scheduled_s
    for sid, n in (("a", 300), ("c", 301)):
        alone = shaped.step_time_s(n, n * n / 2, 1)
        assert steps[sid] == pytest.approx(alone + shaped.new_shape_s, abs=1e-9)
    assert steps["b"] == pytest.approx(shaped.step_time_s(300, 300 * 300 / 2, 1), abs=1e-9)
