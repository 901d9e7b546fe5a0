"""sim/plan.py and ``talaria plan``: the fewest GPUs that meet a per-model p95 SCT SLO, for
talaria, a static packing, dedicated groups of the right size and dedicated whole nodes."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

from typer.testing import CliRunner

from talaria.cli import app
from talaria.sim.plan import Point, cheapest, dedicated_layout, groups_of, worst_model


def _point(family: str, gpus: tuple[int, ...], p95: dict[str, float]) -> Point:
    return Point(family, ((),) * len(gpus), gpus, 0.0, max(p95.values()), 0.0, p95)


def test_cheapest_takes_the_fewest_gpus_where_every_model_meets_its_bound() -> None:
    bounds = {"a": 100.0, "b": 1000.0}
    points = [
        _point("dedicated", (8, 8), {"a": 90, "b": 900}),
        _point("dedicated", (4, 8), {"a": 120, "b": 900}),  # a over: fewer GPUs, not chosen
        _point("dedicated", (4, 4, 4), {"a": 99, "b": 1000}),
        _point("dedicated", (2, 4), {"a": 100, "b": 1001}),
    ]
    assert cheapest(points, bounds) is points[2]
    assert cheapest(points, {"a": 50.0, "b": 1000.0}) is None
    assert worst_model(points[1], bounds) == "a" and worst_model(points[3], bounds) == "b"


def test_dedicated_layouts_and_their_groups() -> None:
    layout, gpus = dedicated_layout({"a": 2, "b": 1}, {"a": 4, "b": 1})
    assert layout == (("a",), ("a",), ("b",)) and gpus == (4, 4, 1)
    assert groups_of(layout, gpus) == [
        {"models": ["a"], "group_gpus": 4, "replicas": 2},
        {"models": ["b"], "group_gpus": 1, "replicas": 1},
    ]


def test_talaria_plan_writes_the_gpus_each_family_needs(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    png = tmp_path / "plan.png"
    result = CliRunner().invoke(
        app,
        ["plan", "--preset", "fleet", "--seed", "2", "--sessions", "40", "--jobs", "2",
         "--json", str(out), "--plot", str(png), "--no-progress"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    reference, bounds = doc["reference"]["p95_by_model"], doc["slo"]["by_model"]
    assert bounds == {m: 1.5 * p95 for m, p95 in reference.items()}
    plans = doc["plans"]

    def meets(point: dict) -> bool:  # type: ignore[type-arg]
        return all(point["p95_by_model"][m] <= bound for m, bound in bounds.items())

    whole = plans["dedicated_node"]
    assert whole["gpus"] == 120 and whole["nodes"] == 15  # one node per model meets 1.5×
    dedicated = plans["dedicated"]
    minimum = doc["memory_minimum"]
    assert minimum["gpus"] == 77 and dedicated["gpus"] >= minimum["gpus"]
    assert meets(dedicated) and dedicated["gpus"] < whole["gpus"]
    for group in dedicated["groups"]:  # never below the model's memory minimum
        (model,) = group["models"]
        assert group["group_gpus"] >= minimum["group_gpus"][model]
    static = plans["static"]
    assert meets(static) and static["gpus"] == 8 * static["nodes"]
    cheaper = [p for p in doc["points"] if p["family"] == "static" and p["gpus"] < static["gpus"]]
    assert not any(meets(p) for p in cheaper)  # nothing smaller that meets it was skipped
    models = {m for node in whole["layout"] for m in node}
    assert {m for node in static["layout"] for m in node} == models
    assert {m for node in dedicated["layout"] for m in node} == models
    talaria = plans["talaria"]
    assert meets(talaria) and talaria["gpus"] <= min(dedicated["gpus"], static["gpus"])
    shared = [p for p in doc["points"] if p["family"] == "talaria"]
    assert shared[0]["layout"] == dedicated["layout"]  # from the dedicated plan's groups
    for before, after in pairwise(shared):  # one model moved per step
        assert after["nodes"] == before["nodes"] - 1 and after["gpus"] < before["gpus"]
        assert sorted(m for node in after["layout"] for m in node) == sorted(models)
    assert png.stat().st_size > 0
    for family in ("talaria", "static", "dedicated", "dedicated_node", "memory minimum 77"):
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
    whole = [p for p in doc["points"] if p["family"] == "dedicated_node"]
    assert whole[0]["nodes"] == 6  # the reference: one node per model
    # ×1.0 is met by the reference itself: no node added
    assert doc["plans"]["dedicated_node"]["nodes"] == 6 and len(whole) == 1
    tight = tmp_path / "tight.json"
    p95 = min(doc["reference"]["p95_by_model"].values())
    result = CliRunner().invoke(
        app,
        ["plan", "--preset", "cluster", "--sessions", "24", "--slo-p95-s", str(0.9 * p95),
         "--jobs", "1", "--max-nodes", "9", "--json", str(tight), "--no-progress"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(tight.read_text())
    assert doc["slo"]["by_model"] == {m: 0.9 * p95 for m in doc["reference"]["p95_by_model"]}
    added = [p for p in doc["points"] if p["family"] == "dedicated_node"]
    assert [p["nodes"] for p in added] == list(range(6, 6 + len(added)))  # one at a time
    assert len(added) > 1
