"""Sub-agents in the replay (sim/subagents.py, sim/replay.py): a child starts at its parent's
call's answer and its parent waits for it; a child beside its parent's KV reuses the shared
prefix (runtime/engines/sim_kv.py), one elsewhere recomputes it; the talaria router sends
children to their parents (core/routing/scorers/parent_kv.py); the trace fields and the
generator."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from talaria.core.catalog import load_catalog
from talaria.core.trace import SessionTrace, TraceCall, TraceError, read_trace, write_trace
from talaria.core.types import KvSource
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import TALARIA
from talaria.sim.experiment import ExperimentSetup, run_experiment
from talaria.sim.presets import get_preset
from talaria.sim.replay import NodeSetup, replay
from talaria.sim.subagents import SubagentSpec, add_subagents, spawn_table
from talaria.sim.workload import generate_sessions

CATALOG = load_catalog()
MODEL = "gpt-oss-120b"


def session(
    sid: str,
    prompts: tuple[int, ...],
    gap_s: float = 1.0,
    parent: str | None = None,
    at: int | None = None,
    prefix: int | None = None,
) -> SessionTrace:
    """A session of ``len(prompts)`` calls of 50 output tokens, append-only."""
    calls, prev = [], 0
    for i, prompt in enumerate(prompts):
        last = i == len(prompts) - 1
        calls.append(
            TraceCall(
                sid, i, MODEL, 0.0, prompt, prompt if i == 0 else prompt - prev, 50,
                None if last else gap_s, parent_session_id=parent,
                parent_call_index=at if i == 0 else None,
                parent_prefix_tokens=prefix if i == 0 else None,
            )
        )  # fmt: skip
        prev = prompt + 50
    return SessionTrace(sid, MODEL, 0.0, tuple(calls))


PARENT = session("p", (6000, 6400, 6800))
CHILD = session("p.a0", (4500, 5000, 5500, 6000), gap_s=2.0, parent="p", at=0, prefix=4000)


def one_node(sessions: list[SessionTrace]) -> dict[str, object]:
    layout = [("node0", NodeSetup("h200x8", "default", (MODEL,)))]
    outcome = replay(sessions, CATALOG, layout, TALARIA, SchedulerConfig())
    return {s.session_id: s for s in outcome.sessions}


def test_a_child_runs_inside_its_parents_tool_gap_and_reuses_its_prefix() -> None:
    out = one_node([PARENT, CHILD])
    parent, child = out["p"], out["p.a0"]
    assert child.start_s == pytest.approx(parent.calls[0].finished_s)  # type: ignore[attr-defined]
    # the parent's next call waits for the child's end (longer than the 1 s gap)
    assert parent.calls[1].arrival_s >= child.end_s > parent.calls[0].finished_s + 1.0  # type: ignore[attr-defined]
    first = child.calls[0]  # type: ignore[attr-defined]
    assert first.kv_source is KvSource.HBM and first.cached_tokens == 4000  # whole blocks of 16
    assert first.recomputed_tokens == 0


def test_without_a_shared_prefix_or_without_the_parent_nothing_is_reused() -> None:
    alone = dataclasses.replace(CHILD, calls=tuple(
        dataclasses.replace(c, parent_prefix_tokens=None) for c in CHILD.calls
    ))  # fmt: skip
    assert one_node([PARENT, alone])["p.a0"].calls[0].kv_source is KvSource.NEW  # type: ignore[attr-defined]
    # the parent is not in the trace: the child starts at its own offset, prefix recomputed
    orphan = one_node([CHILD])["p.a0"]
    first = orphan.calls[0]  # type: ignore[attr-defined]
    assert orphan.start_s == 0.0  # type: ignore[attr-defined]
    assert (first.kv_source, first.recomputed_tokens) == (KvSource.RECOMPUTE, 4000)


def test_spawn_table_and_its_errors() -> None:
    assert spawn_table([PARENT, CHILD]) == {("p", 0): [CHILD]}
    late = session("p.a0", (4500,), parent="p", at=3, prefix=10)
    with pytest.raises(TraceError, match="has 3 calls"):
        spawn_table([PARENT, late])
    a = session("a", (100, 200), parent="b", at=0)
    b = session("b", (100, 200), parent="a", at=0)
    with pytest.raises(TraceError, match="loop"):
        spawn_table([a, b])


def test_the_spawn_fields_survive_a_trace_file(tmp_path: Path) -> None:
    write_trace(tmp_path / "t.jsonl", [PARENT, CHILD])
    back = {s.session_id: s for s in read_trace(tmp_path / "t.jsonl")}
    assert back["p.a0"] == CHILD and back["p.a0"].parent_session_id == "p"


def test_the_generator_keeps_the_parents_and_adds_children() -> None:
    preset = get_preset("subagents")
    windows = {m: CATALOG.model(m).context_window_tokens for m in preset.workload.models}
    parents = generate_sessions(preset.workload, windows, {}, 3)
    spec = SubagentSpec()
    mixed = add_subagents(parents, preset.workload, spec, windows, {}, 3)
    assert [s for s in mixed if s.parent_session_id is None] == parents
    children = [s for s in mixed if s.parent_session_id is not None]
    assert 0.2 < len(children) / len(parents) < 0.47  # a third, binomial(120, 1/3) ± 3σ
    by_id = {s.session_id: s for s in parents}
    for child in children:
        parent, first = by_id[child.parent_session_id or ""], child.calls[0]
        assert child.model == parent.model and child.session_id == f"{parent.session_id}.a0"
        assert first.parent_call_index is not None
        assert 0 <= first.parent_call_index < parent.num_calls - 1
        shared = round(spec.prefix_share * parent.calls[0].prompt_tokens)
        assert first.parent_prefix_tokens == min(shared, first.prompt_tokens)
    assert spawn_table(mixed)  # every spawn valid
    none = add_subagents(parents, preset.workload, SubagentSpec(fraction=0.0), windows, {}, 3)
    assert none == parents


def test_talaria_sends_children_to_their_parents_node() -> None:
    """Two nodes serve the model, 16 parents start 0.2 s apart and spread over both by load;
    every child's first call finds its parent's prefix under talaria, while the router blind
    to it (weight 0) sends children by load alone, some away from their parents."""
    parents = [session(f"s{k}", (6000, 6400, 6800, 7200), gap_s=0.5) for k in range(16)]
    parents = [dataclasses.replace(p, start_s=0.2 * k, calls=tuple(
        dataclasses.replace(c, arrival_offset_s=0.2 * k) for c in p.calls
    )) for k, p in enumerate(parents)]  # fmt: skip
    children = [
        session(f"s{k}.a0", (4500, 5000), parent=f"s{k}", at=1, prefix=4000) for k in range(16)
    ]
    setup = ExperimentSetup(
        "h200x8", "default", (MODEL,), nodes=2, node_models=((MODEL,), (MODEL,))
    )
    doc = run_experiment(
        parents + children, CATALOG, setup, ("talaria", "talaria-no-parent"),
        include_dedicated=False, include_oracle=False,
    )  # fmt: skip
    sub = {name: doc["policies"][name]["subagents"] for name in doc["policies"]}
    assert sub["talaria"]["from_parent"] == sub["talaria"]["first_calls"] == 16
    assert sub["talaria"]["recomputed_tokens"] == 0
    assert doc["policies"]["talaria"]["routing_reasons"]["kv-parent"] == 16
    assert sub["talaria-no-parent"]["from_parent"] < 16
    assert sub["talaria-no-parent"]["recomputed_tokens"] > 0
