"""The placement controller in a replay (sim/placement_driver.py): cold starts, moves that
relieve a time-shared node, and no call lost."""

from __future__ import annotations

from talaria.core.catalog import load_catalog
from talaria.core.placement import PlacementConfig
from talaria.core.trace import SessionTrace, TraceCall
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import TALARIA
from talaria.runtime.sim_node import NodeSetup
from talaria.sim.metrics import percentile
from talaria.sim.replay import ReplayOutcome, replay

CATALOG = load_catalog()
SERVER = CATALOG.server("h200x8")


def _session(sid: str, model: str, start: float, calls: int = 20, gap: float = 5.0) -> SessionTrace:
    out = []
    for i in range(calls):
        out.append(
            TraceCall(
                sid, i, model, start, 8_000 + 1_000 * i, 8_000 if i == 0 else 1_000, 300,
                gap if i < calls - 1 else None,
            )
        )  # fmt: skip
    return SessionTrace(sid, model, start, tuple(out))


def _layout(*nodes: tuple[str, ...]) -> list[tuple[str, NodeSetup]]:
    return [(f"n{i}", NodeSetup("h200x8", "default", models)) for i, models in enumerate(nodes)]


def _run(
    sessions: list[SessionTrace],
    layout: list[tuple[str, NodeSetup]],
    placement: PlacementConfig | None,
) -> ReplayOutcome:
    return replay(sessions, CATALOG, layout, TALARIA, SchedulerConfig(), placement=placement)


def test_a_model_no_node_hosts_is_placed_from_storage_when_its_first_call_comes() -> None:
    sessions = [
        _session("g0", "glm-4.5-fp8", 0.0, calls=4),
        _session("o0", "gpt-oss-120b", 10.0, calls=4),
    ]
    outcome = _run(sessions, _layout(("glm-4.5-fp8",)), PlacementConfig())
    assert sum(len(s.calls) for s in outcome.sessions) == 8  # no call lost
    placement = outcome.placement
    assert placement is not None
    [move] = placement["moves"]
    assert (move["kind"], move["model"], move["reason"], move["source"]) == (
        "add", "gpt-oss-120b", "cold-start", None,
    )  # fmt: skip
    cold = SERVER.placement_s(CATALOG.model("gpt-oss-120b").weight_bytes, from_peer=False)
    assert move["seconds"] == cold
    assert placement["cold_waits"] == 1 and placement["cold_wait_s_total"] >= cold
    late = next(s for s in outcome.sessions if s.session_id == "o0")
    assert late.sct_s > cold
    assert placement["final_layout"] == {"n0": ["glm-4.5-fp8", "gpt-oss-120b"]}


def _contended() -> tuple[list[SessionTrace], list[tuple[str, NodeSetup]]]:
    """Two busy models time-sharing n0, a light one on n1, an idle one on n2; sessions keep
    arriving, so new ones can go where a moved model serves."""
    sessions = []
    for i in range(24):
        sessions.append(_session(f"a{i}", "glm-4.5-fp8", 20.0 * i))
        sessions.append(_session(f"b{i}", "qwen3-235b-a22b-bf16", 20.0 * i + 10))
    sessions += [_session(f"c{i}", "gpt-oss-120b", 100.0 * i) for i in range(4)]
    layout = _layout(
        ("glm-4.5-fp8", "qwen3-235b-a22b-bf16"), ("gpt-oss-120b",), ("llama-4-scout-bf16",)
    )
    return sessions, layout


def test_a_busy_model_moves_off_a_time_shared_node_and_its_sessions_finish_sooner() -> None:
    sessions, layout = _contended()
    static = _run(sessions, layout, None)
    placed = _run(sessions, layout, PlacementConfig())
    calls = sum(s.num_calls for s in sessions)
    assert sum(len(s.calls) for s in placed.sessions) == calls
    assert placed.placement is not None
    moves = placed.placement["moves"]
    first = moves[0]
    assert first["reason"] == "move" and first["kind"] == "add" and first["source"] == "n0"
    assert first["model"] in ("glm-4.5-fp8", "qwen3-235b-a22b-bf16")
    assert first["node"] == "n2"  # beside the idle model, not the light one
    # sessions that start once the moved model serves on its own: as if each model had its
    # own node (dedicated), where the static layout keeps them time-sharing
    ready = first["at_s"] + first["seconds"]
    late = {s.session_id for s in sessions if s.start_s > ready and s.session_id[0] in "ab"}
    dedicated = _run(sessions, _layout(*[(m,) for m in {s.model for s in sessions}]), None)
    p50 = {
        name: {
            prefix: percentile(
                [s.sct_s for s in o.sessions if s.session_id in late and s.session_id[0] == prefix],
                50,
            )
            for prefix in "ab"
        }
        for name, o in (("static", static), ("placed", placed), ("dedicated", dedicated))
    }
    for prefix in "ab":
        assert p50["static"][prefix] > 1.2 * p50["dedicated"][prefix], p50
        assert p50["placed"][prefix] < 1.1 * p50["dedicated"][prefix], p50
    again = _run(sessions, layout, PlacementConfig())
    assert again.placement == placed.placement  # seeded and virtual: the same moves


def test_a_cold_model_is_placed_only_on_a_gpu_group_that_holds_it() -> None:
    """MiniMax-M2 (230 GB) needs a group of 4 GPUs (core/groups.py). The idle 2-GPU group is
    the least loaded host and its share of the host memory (325 GB) holds the weights beside
    gpt-oss-120b's 65 GB, but its GPUs cannot hold the model: the busy 4-GPU group gets it."""
    layout = [
        ("n0", NodeSetup("h200x8", "default", ("gpt-oss-120b",), 2)),
        ("n1", NodeSetup("h200x8", "default", ("glm-4.5-air-fp8",), 4)),
    ]
    sessions = [_session(f"a{i}", "glm-4.5-air-fp8", 2.0 * i, calls=6) for i in range(6)]
    sessions.append(_session("m0", "minimax-m2", 10.0, calls=4))
    outcome = _run(sessions, layout, PlacementConfig())
    assert sum(len(s.calls) for s in outcome.sessions) == 6 * 6 + 4  # no call lost
    assert outcome.placement is not None
    moves = outcome.placement["moves"]
    assert [(m["kind"], m["node"]) for m in moves if m["model"] == "minimax-m2"] == [("add", "n1")]
    assert "minimax-m2" not in outcome.placement["final_layout"]["n0"]
