"""sim/plan.py and ``talaria plan``: the fewest GPUs that meet a per-model p95 SCT SLO, for
talaria, a static packing, dedicated groups of the right size and dedicated whole nodes."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from typer.testing import CliRunner

from talaria.cli import app
from talaria.core.catalog import load_catalog
from talaria.sim.placement import Layout, share_group
from talaria.sim.plan import more_nodes, search_dedicated, search_shared, slo_bounds
from talaria.sim.plan_figures import groups_of
from talaria.sim.plan_replay import (
    Candidate,
    Moved,
    Point,
    cheapest,
    dedicated_layout,
    meets,
    runner,
    worst_model,
)
from talaria.sim.presets import get_preset


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


def _replayer(
    p95: Callable[[Layout, tuple[int, ...]], Mapping[str, float]], tried: list[Candidate]
) -> Callable[[Sequence[Candidate]], list[Point]]:
    """Replays by a rule instead of the simulator, noting every candidate."""

    def run(candidates: Sequence[Candidate]) -> list[Point]:
        tried.extend(candidates)
        return [
            Point(c.family, c.layout, c.gpus, 0.0, 0.0, 0.0, dict(p95(c.layout, c.gpus)))
            for c in candidates
        ]

    return run


def test_dedicated_grows_the_group_of_a_model_that_more_replicas_do_not_help() -> None:
    """A model whose p95 is 100 s × 8 ÷ its group's GPUs, plus 1,000 s while it has one
    replica: a second replica helps first, then only larger groups do. The search reaches
    groups of 8 (p95 100 s ≤ 150 s) where replicas alone never would."""

    def p95(layout: Layout, gpus: tuple[int, ...]) -> dict[str, float]:
        size = max(g for models, g in zip(layout, gpus, strict=True) if models == ("slow",))
        replicas = sum(models == ("slow",) for models in layout)
        return {"slow": 800.0 / size + (1000.0 if replicas == 1 else 0.0), "easy": 1.0}

    tried: list[Candidate] = []
    run = _replayer(p95, tried)
    points = search_dedicated({"slow": 1, "easy": 1}, {"slow": 150.0, "easy": 10.0}, 8, 64, run)
    final = points[-1]
    assert final.p95_by_model["slow"] <= 150.0
    assert groups_of(final.layout, final.gpus_per_node)[0] == {
        "models": ["slow"], "group_gpus": 8, "replicas": 2
    }  # fmt: skip
    assert [max(c.gpus) for c in tried][:3] == [1, 1, 2]  # first: one more replica, or 2 GPUs
    # seven steps of two replays: (1, 2), (1, 3), (2, 2), (2, 3), (4, 2), (4, 3), (8, 2); a
    # rule that doubles only a single replica adds 1-GPU replicas up to the 64-GPU cap
    assert len(tried) == 1 + 7 * 2


def test_dedicated_stops_at_the_gpu_cap_when_nothing_meets() -> None:
    tried: list[Candidate] = []
    run = _replayer(lambda layout, gpus: {"a": 1e9}, tried)
    points = search_dedicated({"a": 1}, {"a": 1.0}, 8, 6, run)
    assert all(p.gpus <= 6 for p in points) and not any(p.p95_by_model["a"] <= 1 for p in points)


def _sharing(demand: dict[str, float]) -> Callable[[Layout, Sequence[int], str], Moved | None]:
    weights = {m: 10e9 for m in demand}
    minimum = {m: 1 for m in demand}

    def move(layout: Layout, gpus: Sequence[int], model: str) -> Moved | None:
        return share_group(layout, gpus, model, demand, weights, minimum, 1000e9, 8,
                           lambda names, size: True)  # fmt: skip

    return move


def test_shared_drops_a_failing_move_and_tries_the_next_mover() -> None:
    """Models a–d on 2-GPU groups of their own, coldest first; a layout fails when b shares a
    group. a's move (into b's group, the least loaded) and b's are dropped, and the movers
    after them are still tried: c joins a; d's move, into b's group, is dropped."""
    demand = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    layout, gpus = dedicated_layout(dict.fromkeys(demand, 1), dict.fromkeys(demand, 2))
    start = Point("dedicated", layout, gpus, 0.0, 0.0, 0.0, dict.fromkeys(demand, 1.0))

    def p95(layout: Layout, gpus: tuple[int, ...]) -> dict[str, float]:
        shared_b = any("b" in models and len(models) > 1 for models in layout)
        return {m: 200.0 if shared_b else 100.0 for m in demand}

    bounds = dict.fromkeys(demand, 150.0)
    for jobs in (1, 2, 3):
        tried: list[Candidate] = []
        points = search_shared(start, demand, _sharing(demand), bounds, jobs, _replayer(p95, tried))
        best = cheapest(points, bounds)
        assert best is not None and best.gpus == 6, jobs
        assert sorted(map(sorted, best.layout)) == [["a", "c"], ["b"], ["d"]], jobs
        assert sum(not meets(p, bounds) for p in points) >= 3, jobs  # a's, b's and d's moves


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
    # first the pools (sim/plan_pool.py), then the moves from the cheapest layout that meets
    # the SLO among them and the dedicated plan's (its replay again: the moves' first point)
    searches = [p["search"] for p in shared]
    start = searches.index("moves")
    assert set(searches[:start]) <= {"pool"} and set(searches[start:]) == {"moves"}
    for pool in shared[:start]:  # the coldest models on whole nodes, the others on their groups
        assert {m for node in pool["layout"] for m in node} == models
        sizes = zip(pool["layout"], pool["gpus_per_node"], strict=True)
        assert any(size == 8 and len(node) > 1 for node, size in sizes)
    assert meets(shared[start])
    moves = shared[start:]
    for i, moved in enumerate(moves[1:], 1):  # one model moved from a layout kept before
        kept = [p["nodes"] for p in moves[:i] if meets(p)]
        assert moved["nodes"] + 1 in kept and moved["gpus"] < dedicated["gpus"]
        assert sorted(m for node in moved["layout"] for m in node) == sorted(models)
    serverless = plans["serverless"]  # its pools under request-level instances, or dedicated
    assert meets(serverless) and serverless["gpus"] <= dedicated["gpus"]
    assert all(p["weight_loads"] for p in doc["points"])  # every replay counts its loads by tier
    assert set(talaria["slo_by_model"]) == set(bounds) and all(
        v["met"] for v in talaria["slo_by_model"].values()
    )
    assert png.stat().st_size > 0
    for family in ("talaria", "serverless", "static", "dedicated", "dedicated_node", "minimum 77"):
        assert family in result.output


def test_an_slo_tighter_than_one_node_per_model_adds_dedicated_nodes() -> None:
    """``dedicated_node`` on the cluster preset's replays: ×1.0 is met by the reference itself
    (one node per model, none added); a bound below every model's p95 there adds whole nodes
    one at a time, up to the limit."""
    catalog = load_catalog()
    preset = get_preset("cluster").with_sessions(24)
    models = preset.workload.models
    run = runner(preset.sessions(catalog, 0), catalog, preset.server, preset.profile,
                 preset.quantum_s, 1, None)  # fmt: skip
    sizes = {m: 8 for m in models}
    [reference] = run(
        [Candidate("dedicated_node", *dedicated_layout(dict.fromkeys(models, 1), sizes))]
    )
    assert reference.nodes == 6
    assert more_nodes(reference, slo_bounds(reference.p95_by_model, 1.0, None), sizes, 9, run) == [
        reference
    ]
    p95 = min(reference.p95_by_model.values())
    tight = slo_bounds(reference.p95_by_model, 1.5, 0.9 * p95)
    assert tight == dict.fromkeys(reference.p95_by_model, 0.9 * p95)  # seconds win over ×
    added = more_nodes(reference, tight, sizes, 9, run)
    assert [p.nodes for p in added] == list(range(6, 6 + len(added)))  # one at a time
    assert 1 < len(added) <= 4  # up to the limit, 9 nodes


def test_a_trace_plans_as_its_preset_and_listed_models_without_sessions_are_served(
    tmp_path: Path,
) -> None:
    """A market's trace plans the same as the preset it came from; a model ``--models`` lists
    with no session is still on the dedicated plan (once, on its smallest group)."""
    trace, by_preset, by_trace = tmp_path / "m.jsonl", tmp_path / "p.json", tmp_path / "t.json"
    common = ["--sessions", "12", "--jobs", "2", "--no-progress"]
    made = CliRunner().invoke(
        app, ["trace", "generate", "--preset", "market", "--sessions", "12", "--out", str(trace)]
    )
    assert made.exit_code == 0, made.output
    result = CliRunner().invoke(
        app, ["plan", "--preset", "market", "--seed", "0", *common, "--json", str(by_preset)]
    )
    assert result.exit_code == 0, result.output
    preset_doc = json.loads(by_preset.read_text())
    traced = {line.split('"model": "')[1].split('"')[0] for line in trace.read_text().splitlines()}
    listed = sorted(set(preset_doc["models"]) - traced)[:2]
    result = CliRunner().invoke(
        app,
        ["plan", "--preset", "market", "--trace", str(trace), "--models", ",".join(listed),
         *common, "--json", str(by_trace)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    trace_doc = json.loads(by_trace.read_text())
    assert set(trace_doc["models"]) == traced | set(listed)
    assert len(preset_doc["models"]) == 24
    dedicated = trace_doc["plans"]["dedicated"]
    served = {m for node in dedicated["layout"] for m in node}
    assert set(listed) <= served
    assert trace_doc["sessions"] == preset_doc["sessions"]
    same = trace_doc["reference"]["p95_by_model"]
    assert same == preset_doc["reference"]["p95_by_model"]


def test_bad_plan_inputs_are_one_clear_error_each() -> None:
    cases = {
        "--models=nosuch": "unknown model 'nosuch'",
        "--models=nosuch@acme": "a variant of 'nosuch'",
        "--models=kimi-k2-instruct": "kimi-k2-instruct needs",
    }
    for arg, message in cases.items():
        result = CliRunner().invoke(app, ["plan", "--preset", "small", arg, "--no-progress"])
        assert result.exit_code == 2, (arg, result.output)
        assert message in " ".join(result.output.split()), (arg, result.output)
        assert "GPUs needed" not in result.output  # nothing was replayed
