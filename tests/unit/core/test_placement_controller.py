"""core/placement/controller.py: the wait a node's time-sharing costs, and the moves of one look."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talaria.core.placement import (
    FleetView,
    MoveKind,
    NodeView,
    PlacementConfig,
    Reason,
    decide,
    node_wait,
    replicas,
)

GB = 1e9
Q = 60.0
CONFIG = PlacementConfig()


def _view(
    nodes: Mapping[str, tuple[str, ...]],
    demand: Mapping[str, float],
    *,
    weights: Mapping[str, float] | None = None,
    budget: float = 1_000 * GB,
    now: float = 10_000.0,
    live: Mapping[str, Mapping[str, int]] | None = None,
    placed: Mapping[str, Mapping[str, float]] | None = None,
    unplaced: frozenset[str] = frozenset(),
    recent: tuple[float, ...] = (),
    measured: float = float("inf"),
) -> FleetView:
    models = {m for ms in nodes.values() for m in ms} | set(demand) | set(unplaced)
    views = [
        NodeView(
            name,
            frozenset(ms),
            budget_bytes=budget,
            placed_s=(placed or {}).get(name, {}),
            live=(live or {}).get(name, {}),
        )
        for name, ms in nodes.items()
    ]
    return FleetView(
        now,
        views,
        demand,
        weights or dict.fromkeys(models, 300 * GB),
        unplaced_waiting=unplaced,
        recent_moves_s=recent,
        measured_s=measured,
        quantum_s=Q,
    )


@pytest.mark.parametrize(
    ("shares", "calls", "switches", "expected"),
    [
        ({"a": 50.0}, {}, {}, 0.0),  # one model: nothing to wait for, however busy
        ({"a": 10.0, "b": 0.0}, {}, {}, 0.0),  # a model without sessions holds no slot
        ({"a": 10.0, "b": 10.0}, {}, {}, 10.0),  # equal slots: half of each model's sessions
        # 3:1 → serving 1.5 Q and ½ Q of a 2 Q round: a waits ¼ of it, b ¾
        ({"a": 30.0, "b": 10.0}, {}, {}, 30 * 0.25 + 10 * 0.75),
        # b's calls last 200 s: it serves at least that long, a 260 s round
        ({"a": 10.0, "b": 10.0}, {"b": 200.0}, {}, (10 * 200 + 10 * Q) / 260),
        # 20 s switches: a 160 s round, each model's sessions wait 100 s of it
        ({"a": 10.0, "b": 10.0}, {}, {"a": 20.0, "b": 20.0}, 20 * 100 / 160),
    ],
)
def test_node_wait_is_the_sessions_waiting_while_other_models_serve_or_switch(
    shares: dict[str, float],
    calls: dict[str, float],
    switches: dict[str, float],
    expected: float,
) -> None:
    assert node_wait(shares, calls, Q, switches) == pytest.approx(expected)


def test_a_cold_model_goes_where_it_adds_the_least_wait() -> None:
    view = _view(
        {"n0": ("a", "b"), "n1": ("c",), "n2": ("d",)},
        {"a": 10, "b": 10, "c": 20, "d": 2, "x": 3},
        unplaced=frozenset({"x"}),
    )
    moves = decide(view, CONFIG)
    assert moves[0].kind is MoveKind.ADD and moves[0].reason is Reason.COLD_START
    assert (moves[0].model, moves[0].node, moves[0].source) == ("x", "n2", None)  # from storage


def test_a_cold_start_evicts_idle_models_but_never_one_with_live_sessions() -> None:
    weights = {"a": 600 * GB, "b": 300 * GB, "c": 600 * GB, "x": 500 * GB}
    view = _view(
        {"n0": ("a", "b"), "n1": ("c",)},
        {"x": 1},  # a, b and c sent nothing for a whole window
        weights=weights,
        budget=1_000 * GB,
        live={"n1": {"c": 1}},
        unplaced=frozenset({"x"}),
    )
    moves = decide(view, CONFIG)
    assert [(m.kind, m.model, m.node) for m in moves[:2]] == [
        (MoveKind.EVICT, "a", "n0"),  # the largest idle model first, only as much as needed
        (MoveKind.ADD, "x", "n0"),
    ]
    assert all(m.model != "c" for m in moves)


def test_nothing_is_idle_before_a_whole_window_has_been_measured() -> None:
    view = _view(
        {"n0": ("a",)},
        {"x": 1},
        weights={"a": 900 * GB, "x": 500 * GB},
        unplaced=frozenset({"x"}),
        measured=CONFIG.window_s / 2,
    )
    assert decide(view, CONFIG) == []  # x waits: nothing may be evicted yet


def test_a_contended_model_moves_to_the_node_it_disturbs_least() -> None:
    view = _view({"n0": ("a", "b"), "n1": ("c",), "n2": ()}, {"a": 20, "b": 20, "c": 20})
    moves = decide(view, CONFIG)
    assert len(moves) == 2
    add, drain = moves
    assert add.kind is MoveKind.ADD and add.reason is Reason.MOVE and add.node == "n2"
    assert add.source == "n0"  # copied from the peer's host memory
    assert drain.kind is MoveKind.DRAIN and drain.node == "n0" and drain.model == add.model


def test_a_replica_placed_recently_is_not_drained_so_the_move_becomes_a_scale_out() -> None:
    view = _view(
        {"n0": ("a", "b"), "n1": ()},
        {"a": 20, "b": 20},
        placed={"n0": {"a": 9_500.0, "b": 9_500.0}},  # 500 s ago < min_hold_s
    )
    moves = decide(view, CONFIG)
    assert [(m.kind, m.reason) for m in moves] == [(MoveKind.ADD, Reason.SCALE_OUT)]


def test_a_redundant_replica_is_given_back() -> None:
    view = _view({"n0": ("a", "b"), "n1": ("a",)}, {"a": 2, "b": 30})
    moves = decide(view, CONFIG)
    assert [(m.kind, m.model, m.node, m.reason) for m in moves] == [
        (MoveKind.DRAIN, "a", "n0", Reason.SCALE_IN)
    ]


@pytest.mark.parametrize(
    ("recent", "moves_expected"),
    [((), 2), ((9_000.0,) * 11, 2), ((9_000.0,) * 12, 0), ((6_000.0,) * 12, 2)],
)
def test_bounded_moves_stop_at_the_hourly_limit(
    recent: tuple[float, ...], moves_expected: int
) -> None:
    view = _view({"n0": ("a", "b"), "n1": ()}, {"a": 20, "b": 20}, recent=recent)
    assert len(decide(view, CONFIG)) == moves_expected  # one move = add + drain


def test_a_gain_under_the_hysteresis_makes_no_move() -> None:
    # the best move: b (1 session) from beside a (30) to beside c (5)
    view = _view({"n0": ("a", "b"), "n1": ("c",)}, {"a": 30, "b": 1, "c": 5})
    source = node_wait({"a": 30, "b": 1}, {}, Q)
    gain = source - node_wait({"c": 5, "b": 1}, {}, Q)
    ratio = gain / source
    moves = decide(view, PlacementConfig(hysteresis=ratio * 0.95))
    assert [(m.kind, m.model, m.node) for m in moves] == [
        (MoveKind.ADD, "b", "n1"),
        (MoveKind.DRAIN, "b", "n0"),
    ]
    assert decide(view, PlacementConfig(hysteresis=ratio * 1.05)) == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from("abcdefg"), max_size=3, unique=True), min_size=1, max_size=5),
    st.dictionaries(st.sampled_from("abcdefgh"), st.integers(0, 40)),
    st.dictionaries(st.sampled_from("abcdefgh"), st.integers(100, 600)),
    st.frozensets(st.sampled_from("abcdefgh"), max_size=2),
)
def test_a_look_keeps_every_node_within_its_budget_and_spares_live_models(
    layout: list[list[str]],
    demand: dict[str, int],
    weight_gb: dict[str, int],
    unplaced: frozenset[str],
) -> None:
    nodes = {f"n{i}": tuple(ms) for i, ms in enumerate(layout)}
    weights = {m: weight_gb.get(m, 200) * GB for m in "abcdefgh"}
    budget = 1_300 * GB
    nodes = {  # start within budget
        n: tuple(m for i, m in enumerate(ms) if sum(weights[x] for x in ms[: i + 1]) <= budget)
        for n, ms in nodes.items()
    }
    live = {n: {m: 1 for m in ms[:1]} for n, ms in nodes.items()}
    view = _view(
        nodes,
        {m: float(v) for m, v in demand.items()},
        weights=weights,
        budget=budget,
        live=live,
        unplaced=frozenset(m for m in unplaced if not any(m in ms for ms in nodes.values())),
    )
    moves = decide(view, CONFIG)
    held = {n: set(ms) for n, ms in nodes.items()}
    for move in moves:
        if move.kind is MoveKind.ADD:
            assert move.model not in held[move.node]
            held[move.node].add(move.model)
        else:  # a drained model's weights stay until it is removed; an evicted one's go
            if move.kind is MoveKind.EVICT:
                assert live[move.node].get(move.model, 0) == 0 and demand.get(move.model, 0) == 0
                held[move.node].discard(move.model)
    for models in held.values():
        assert sum(weights[m] for m in models) <= budget
    bounded = [m for m in moves if m.reason in (Reason.SCALE_OUT, Reason.SCALE_IN, Reason.MOVE)]
    assert len(bounded) <= 2  # one decision per look: a scale out or in, or a move's two halves
    assert all(r >= 0 for r in replicas(view.nodes).values())
