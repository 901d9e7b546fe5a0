"""sim/plan.py and ``talaria plan``: the fewest nodes that meet a p95 SCT SLO."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from talaria.cli import app
from talaria.sim.plan import Point, dedicated_layout, nodes_for


def _point(family: str, nodes: int, p95: float) -> Point:
    return Point(family, nodes, (), p95 / 2, p95, p95 / 2, {})


def test_nodes_for_takes_the_fewest_meeting_even_when_p95_is_not_monotone() -> None:
    points = [_point("static", 5, 2400), _point("static", 6, 2900), _point("static", 7, 1200),
              _point("static", 8, 1000), _point("static", 9, 1300)]  # fmt: skip
    assert nodes_for(points, 1250).nodes == 7  # type: ignore[union-attr]
    assert nodes_for(points, 2500).nodes == 5  # type: ignore[union-attr]
    assert nodes_for(points, 900) is None


def test_dedicated_layout_gives_each_model_its_own_nodes() -> None:
    assert dedicated_layout({"a": 2, "b": 1}) == (("a",), ("a",), ("b",))


def test_talaria_plan_writes_the_nodes_each_family_needs(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    png = tmp_path / "plan.png"
    result = CliRunner().invoke(
        app,
        ["plan", "--preset", "fleet", "--seed", "2", "--sessions", "40", "--jobs", "2",
         "--json", str(out), "--plot", str(png), "--no-progress"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    slo = doc["slo"]["p95_sct_s"]
    assert slo == 1.5 * doc["reference"]["p95_sct_s"]
    dedicated, static = doc["plans"]["dedicated"], doc["plans"]["static"]
    assert dedicated["nodes"] == 15 and dedicated["gpus"] == 120  # one node per model meets 1.5×
    assert static["p95_sct_s"] <= slo and static["nodes"] <= dedicated["nodes"]
    fewer = [p for p in doc["points"] if p["family"] == "static" and p["nodes"] < static["nodes"]]
    assert all(p["p95_sct_s"] > slo for p in fewer)  # nothing smaller that meets it was skipped
    assert {m for node in static["layout"] for m in node} == {
        m for node in dedicated["layout"] for m in node
    }
    talaria = doc["plans"]["talaria"]
    assert talaria["p95_sct_s"] <= slo and talaria["nodes"] <= dedicated["nodes"]
    static_at = {p["nodes"]: p["layout"] for p in doc["points"] if p["family"] == "static"}
    for point in (p for p in doc["points"] if p["family"] == "talaria"):
        if point["nodes"] in static_at:  # both start from the same packing
            assert point["layout"] == static_at[point["nodes"]]
    placement = talaria["placement"]  # where the controller left the models, and why it moved
    assert set(placement) >= {"final_layout", "moves_by_reason", "cold_waits", "config"}
    assert png.stat().st_size > 0
    for family in ("talaria", "static", "dedicated"):
        assert family in result.output


def test_an_slo_tighter_than_one_node_per_model_adds_dedicated_nodes(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(
        app,
        ["plan", "--preset", "cluster", "--sessions", "24", "--slo-x", "1.0", "--jobs", "1",
         "--max-nodes", "9", "--json", str(out), "--no-progress"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    dedicated = [p for p in doc["points"] if p["family"] == "dedicated"]
    assert dedicated[0]["nodes"] == 6  # the reference: one node per model
    # ×1.0 is met by the reference itself: no node added
    assert doc["plans"]["dedicated"]["nodes"] == 6 and len(dedicated) == 1
    tight = tmp_path / "tight.json"
    p95 = doc["reference"]["p95_sct_s"]
    result = CliRunner().invoke(
        app,
        ["plan", "--preset", "cluster", "--sessions", "24", "--slo-p95-s", str(0.9 * p95),
         "--jobs", "1", "--max-nodes", "9", "--json", str(tight), "--no-progress"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(tight.read_text())
    added = [p for p in doc["points"] if p["family"] == "dedicated"]
    assert [p["nodes"] for p in added] == list(range(6, 6 + len(added)))  # one at a time
    assert len(added) > 1
