"""Replay invariants over random small workloads (hypothesis), and experiment determinism.

Workloads are the generator's SWE-bench-style sessions on the paper's three models and the
shipped 8×H200 server; the policy, quantum and node count are drawn too. Whatever the draw:
every call completes exactly once with the trace's output tokens, each session's calls run in
order, memory never goes over capacity, and no session beats its oracle bound.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talaria.core.catalog import load_catalog
from talaria.core.trace import SessionTrace
from talaria.core.types import CallResult
from talaria.runtime.costmodel import CostModel
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import DEFAULT_POLICIES, policy_flags
from talaria.sim.experiment import ExperimentSetup, run_experiment
from talaria.sim.oracle import oracle_sct_s
from talaria.sim.replay import NodeSetup, replay
from talaria.sim.workload import WorkloadSpec, generate_sessions

CATALOG = load_catalog()
MODELS = ("glm-4.5-fp8", "qwen3-235b-a22b-bf16", "qwen3-coder-480b-a35b-fp8")
SERVER, PROFILE = "h200x8", "default"
WINDOWS = {m: CATALOG.model(m).context_window_tokens for m in MODELS}
REASONING = {m: CATALOG.model(m).reasoning for m in MODELS}
COSTS = {
    m: CostModel(CATALOG.model(m), CATALOG.server(SERVER), CATALOG.profile(PROFILE)) for m in MODELS
}


@st.composite
def workloads(draw: st.DrawFn) -> list[SessionTrace]:
    sessions = draw(st.integers(1, 6))
    total_calls = draw(st.none() | st.integers(sessions, 4 * sessions))
    spec = WorkloadSpec(
        sessions=sessions,
        models=MODELS,
        total_calls=total_calls,
        mean_interarrival_s=draw(st.floats(0.0, 30.0)),
    )
    seed = draw(st.integers(0, 2**32 - 1))
    return generate_sessions(spec, WINDOWS, REASONING, seed)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    sessions=workloads(),
    policy=st.sampled_from(DEFAULT_POLICIES),
    quantum_s=st.sampled_from([5.0, 20.0, 60.0]),
    nodes=st.integers(1, 2),
)
def test_replay_invariants(
    sessions: list[SessionTrace], policy: str, quantum_s: float, nodes: int
) -> None:
    seen: list[CallResult] = []
    layout = [(f"node{i}", NodeSetup(SERVER, PROFILE, MODELS)) for i in range(nodes)]
    outcome = replay(
        sessions,
        CATALOG,
        layout,
        policy_flags(policy),
        SchedulerConfig(quantum_s=quantum_s),
        on_call=seen.append,
    )

    # every call completes exactly once
    expected_ids = {f"{s.session_id}/{i}" for s in sessions for i in range(s.num_calls)}
    counts = Counter(r.request_id for r in seen)
    assert set(counts) == expected_ids
    assert max(counts.values()) == 1
    assert len(seen) == sum(s.num_calls for s in sessions)

    traces = {s.session_id: s for s in sessions}
    assert sorted(o.session_id for o in outcome.sessions) == sorted(traces)
    for out in outcome.sessions:
        trace = traces[out.session_id]
        assert out.model == trace.model
        assert [r.request_id for r in out.calls] == [
            f"{trace.session_id}/{i}" for i in range(trace.num_calls)
        ]
        # the trace's tokens, in order, one call after the other
        for call, result in zip(trace.calls, out.calls, strict=True):
            assert result.output_tokens == call.output_tokens
            assert result.prompt_tokens == call.prompt_tokens
            assert result.model == trace.model
            assert result.arrival_s <= result.admitted_s <= result.first_token_s
            assert result.first_token_s <= result.finished_s
        for prev, nxt in zip(out.calls, out.calls[1:], strict=False):
            assert prev.finished_s < nxt.finished_s
            assert prev.finished_s <= nxt.arrival_s
        assert out.start_s == pytest.approx(trace.start_s, abs=1e-9)
        assert out.end_s == pytest.approx(out.calls[-1].finished_s, abs=1e-9)
        # no session beats running alone on its own node
        oracle = oracle_sct_s(trace, COSTS[trace.model])
        assert out.sct_s >= oracle * (1 - 1e-6)

    # memory never over capacity
    assert len(outcome.nodes) == nodes
    for node in outcome.nodes:
        assert node.peak_hbm_bytes <= node.hbm_capacity_bytes * (1 + 1e-12)
        assert node.peak_host_kv_bytes <= node.host_kv_capacity_bytes * (1 + 1e-12)
    assert outcome.makespan_s >= max(o.end_s for o in outcome.sessions) - 1e-9


# -- determinism -----------------------------------------------------------------------------
SMALL = WorkloadSpec(sessions=4, models=MODELS, total_calls=20, mean_interarrival_s=5.0)
EXPERIMENT = ExperimentSetup(SERVER, PROFILE, MODELS, nodes=1, quantum_s=20.0)


def _document(seed: int) -> str:
    sessions = generate_sessions(SMALL, WINDOWS, REASONING, seed)
    doc = run_experiment(sessions, CATALOG, EXPERIMENT, DEFAULT_POLICIES)
    return json.dumps(doc, sort_keys=True)


def test_experiment_is_deterministic_per_seed() -> None:
    first = _document(7)
    assert _document(7) == first
    assert _document(8) != first
    doc = json.loads(first)
    assert set(doc["policies"]) == set(DEFAULT_POLICIES)
    for summary in doc["policies"].values():
        assert summary["calls_completed"] == doc["calls"] == SMALL.total_calls
