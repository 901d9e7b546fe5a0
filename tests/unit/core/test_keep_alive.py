"""Scale to zero (core/placement/keep_alive.py, the controller's rule 0, the demand meter's
idleness): a model's keep-alive is learned from its own calls, and an idle replica goes."""

from __future__ import annotations

import pytest

from talaria.core.placement import FleetView, MoveKind, NodeView, PlacementConfig, Reason, decide
from talaria.core.placement.demand import DemandMeter
from talaria.core.placement.keep_alive import gap_quantile, keep_alive_s


@pytest.mark.parametrize(
    ("gap", "expected"),
    [
        (None, 60.0),  # fewer than two calls: the floor
        (10.0, 60.0),  # 1.1 × 10 under the floor
        (100.0, 110.0),  # 1.1 × the p99 gap
        (1_000.0, 300.0),  # the window caps it
    ],
)
def test_keep_alive_is_the_p99_gap_with_a_margin_between_floor_and_window(
    gap: float | None, expected: float
) -> None:
    assert keep_alive_s(gap, floor_s=60.0, ceiling_s=300.0) == pytest.approx(expected)


def test_a_keep_alive_floor_of_zero_or_less_is_refused() -> None:
    with pytest.raises(ValueError, match="keep-alive floor must be > 0"):
        keep_alive_s(None, floor_s=0.0, ceiling_s=300.0)


def test_the_gap_quantile_is_a_nearest_rank() -> None:
    assert gap_quantile([]) is None
    assert gap_quantile([5.0]) == 5.0
    assert gap_quantile([float(g) for g in range(1, 101)]) == 99.0
    assert gap_quantile([1.0, 2.0, 3.0, 50.0]) == 50.0


def test_the_meter_reports_each_models_idleness_and_gaps() -> None:
    meter = DemandMeter(window_s=1_000.0)
    for t, model in [(0.0, "a"), (10.0, "b"), (30.0, "a"), (100.0, "a")]:
        meter.arrived(t, model, f"s{t}")
    assert meter.idle_s(150.0) == {"a": 50.0, "b": 140.0}
    assert meter.gap_p99_s(150.0) == {"a": 70.0}  # b has one call: no gap
    assert meter.gap_p99_s(150.0, window_s=130.0) == {"a": 70.0}  # 0 is outside: 30 → 100
    assert meter.gap_p99_s(150.0, window_s=60.0) == {}  # only 100 is inside


def _view(
    *, idle: float | None, live: int = 0, placed_ago: float | None = None, waiting: bool = False
) -> FleetView:
    now = 10_000.0
    placed = {} if placed_ago is None else {"tail": now - placed_ago}
    node = NodeView("n0", frozenset({"head", "tail"}), live={"tail": live}, placed_s=placed)
    return FleetView(
        now,
        [node],
        {"head": 5.0},
        {"head": 100e9, "tail": 100e9},
        unplaced_waiting=frozenset({"tail"}) if waiting else frozenset(),
        measured_s=5_000.0,
        idle_s={"head": 1.0} | ({} if idle is None else {"tail": idle}),
        keep_alive_s={"tail": 600.0},
    )


@pytest.mark.parametrize(
    ("view", "evicted"),
    [
        (_view(idle=600.0), True),
        (_view(idle=None), True),  # no call since measuring began (5,000 s)
        (_view(idle=599.0), False),
        (_view(idle=900.0, live=1), False),  # a live session keeps it
        (_view(idle=900.0, placed_ago=300.0), False),  # placed too recently
        (_view(idle=900.0, placed_ago=700.0), True),
        (_view(idle=900.0, waiting=True), False),
    ],
)
def test_an_idle_replica_scales_to_zero_after_its_keep_alive(
    view: FleetView, evicted: bool
) -> None:
    moves = [m for m in decide(view, PlacementConfig()) if m.reason is Reason.SCALE_TO_ZERO]
    expected = [(MoveKind.EVICT, "tail", "n0")] if evicted else []
    assert [(m.kind, m.model, m.node) for m in moves] == expected
    # the head has a call a second ago and no keep-alive entry: never scaled to zero
    assert all(m.model != "head" for m in decide(view, PlacementConfig()))
