"""How many nodes a fleet needs to meet an SLO on its sessions' completion time (issue 28).

The SLO: p95 SCT ≤ ``slo_p95_s``, by default ``slo_x`` × the *reference*, the p95 SCT of
dedicated nodes, one per model (each model alone on its own node, never switched: what
serverful serving gives). For each layout family the plan replays the sessions at every node
count from the fewest that hold the models' weights up to ``max_nodes`` (each replay is
independent, so they run ``jobs`` at a time) and takes the fewest nodes whose p95 meets the
SLO:

- ``static``: the models packed onto ``n`` nodes by demand (sim/placement.py ``pack``), the
  ``talaria`` policy (its router and scheduler), the layout fixed for the whole trace; counts
  are tried fewest first, ``jobs`` at a time, until one meets both the SLO and the reference
  itself (so the curve covers every SLO from 1× the reference up);
- ``talaria``: the same packing as the start, and the placement controller moving models by
  the demand it measures (core/placement/, the ``placement`` policy); counts as for
  ``static``, until one meets the SLO (its replays are the slow ones);
- ``dedicated``: every model on nodes of its own; from one node per model, one more node at a
  time for the model whose sessions' p95 SCT is the worst, until the SLO is met.

Every count evaluated is kept (``points``), so the nodes needed for any other SLO are read off
the same replays (``nodes_for``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

from talaria.core.catalog import Catalog
from talaria.core.trace import SessionTrace
from talaria.sim.experiment import ExperimentSetup, run_experiment
from talaria.sim.metrics import percentile
from talaria.sim.placement import NoPlacement, model_demand, pack, weight_budget_bytes

POLICY = "talaria"
FAMILY_POLICY = {"static": POLICY, "dedicated": POLICY, "talaria": "placement"}
"""The replay policy of each layout family (sim/policies.py)."""


@dataclass(frozen=True)
class Point:
    """One replay of the plan: a layout and the SCTs it gave."""

    family: str
    nodes: int
    layout: tuple[tuple[str, ...], ...]
    p50_sct_s: float
    p95_sct_s: float
    mean_sct_s: float
    sct_s: Mapping[str, float]
    placement: Mapping[str, Any] | None = None
    """The placement controller's summary (``talaria`` family), else None."""

    def summary(self) -> dict[str, Any]:
        """The point without its per-session SCTs (for documents and tables)."""
        extra = {"placement": self.placement} if self.placement is not None else {}
        return {
            **extra,
            "family": self.family,
            "nodes": self.nodes,
            "layout": [list(models) for models in self.layout],
            "p50_sct_s": self.p50_sct_s,
            "p95_sct_s": self.p95_sct_s,
            "mean_sct_s": self.mean_sct_s,
        }


def replay_layout(
    family: str,
    sessions: Sequence[SessionTrace],
    catalog: Catalog,
    server: str,
    profile: str,
    quantum_s: float,
    layout: tuple[tuple[str, ...], ...],
) -> Point:
    """Replay ``sessions`` on ``layout`` under the family's policy (``FAMILY_POLICY``)."""
    models = tuple(dict.fromkeys(m for node in layout for m in node))
    setup = ExperimentSetup(server, profile, models, len(layout), quantum_s, layout)
    policy = FAMILY_POLICY[family]
    doc = run_experiment(sessions, catalog, setup, [policy], include_dedicated=False)
    result = doc["policies"][policy]
    return Point(
        family,
        len(layout),
        layout,
        result["p50_sct_s"],
        result["p95_sct_s"],
        result["mean_sct_s"],
        result["sct_s"],
        _placement_summary(result.get("placement")),
    )


def _placement_summary(placement: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """What a plan keeps of a replay's placement: moves by reason, copies, cold starts and
    the final layout (not every move)."""
    if placement is None:
        return None
    return {k: v for k, v in placement.items() if k != "moves"}


def dedicated_layout(replicas: Mapping[str, int]) -> tuple[tuple[str, ...], ...]:
    """Each model on ``replicas[m]`` nodes of its own."""
    return tuple((m,) for m, count in replicas.items() for _ in range(count))


def static_layouts(
    sessions: Sequence[SessionTrace],
    catalog: Catalog,
    server: str,
    profile: str,
    models: Sequence[str],
    max_nodes: int,
) -> dict[int, tuple[tuple[str, ...], ...]]:
    """The demand packing at every node count that holds the models, up to ``max_nodes``."""
    demand = {m: 0.0 for m in models}
    demand.update(model_demand(sessions, catalog, server, profile))
    weights = {m: catalog.model(m).weight_bytes for m in models}
    budget = weight_budget_bytes(catalog, server)
    layouts = {}
    for nodes in range(1, max_nodes + 1):
        try:
            layouts[nodes] = pack(demand, weights, nodes, budget)
        except NoPlacement:
            continue
    return layouts


def nodes_for(points: Iterable[Point], slo_p95_s: float) -> Point | None:
    """The evaluated point with the fewest nodes that meets the SLO (None: none does)."""
    meeting = [p for p in points if p.p95_sct_s <= slo_p95_s]
    return min(meeting, key=lambda p: p.nodes) if meeting else None


Replayer = Callable[[Sequence[tuple[str, tuple[tuple[str, ...], ...]]]], list[Point]]


def plan(
    sessions: Sequence[SessionTrace],
    catalog: Catalog,
    server: str,
    profile: str,
    quantum_s: float,
    models: Sequence[str],
    *,
    slo_x: float = 1.5,
    slo_p95_s: float | None = None,
    max_nodes: int | None = None,
    jobs: int = 1,
    on_point: Callable[[Point], None] | None = None,
) -> dict[str, Any]:
    """The plan's document (module docstring): the SLO, the reference, each family's plan
    (its fewest nodes meeting the SLO, the layout and SCTs there, or None) and every point."""
    limit = max_nodes or 2 * len(models)
    run = _runner(sessions, catalog, server, profile, quantum_s, jobs, on_point)
    one_each = {m: 1 for m in models}
    [reference] = run([("dedicated", dedicated_layout(one_each))])
    slo = slo_p95_s if slo_p95_s is not None else slo_x * reference.p95_sct_s
    layouts = list(static_layouts(sessions, catalog, server, profile, models, limit).values())
    enough = min(slo, reference.p95_sct_s)
    packed: dict[str, list[Point]] = {"static": [], "talaria": []}
    for family, points in packed.items():
        stop = enough if family == "static" else slo
        for start in range(0, len(layouts), jobs):  # in rounds of ``jobs``, fewest nodes first
            points += run([(family, layout) for layout in layouts[start : start + jobs]])
            if any(p.p95_sct_s <= stop for p in points):
                break
    dedicated = [reference]
    replicas = dict(one_each)
    while dedicated[-1].p95_sct_s > slo and sum(replicas.values()) < limit:
        worst = _worst_model(dedicated[-1], sessions)
        replicas[worst] += 1
        dedicated += run([("dedicated", dedicated_layout(replicas))])
    plans = {}
    families = {**packed, "dedicated": dedicated}
    for family, points in families.items():
        chosen = nodes_for(points, slo)
        plans[family] = chosen.summary() if chosen is not None else None
    return {
        "slo": {"p95_sct_s": slo, "x": None if slo_p95_s is not None else slo_x},
        "reference": reference.summary(),
        "plans": plans,
        "points": [p.summary() for points in families.values() for p in points],
        "max_nodes": limit,
        "policy": POLICY,
    }


def _worst_model(point: Point, sessions: Sequence[SessionTrace]) -> str:
    """The model whose sessions' p95 SCT is the largest at ``point``."""
    by_model: dict[str, list[float]] = {}
    for session in sessions:
        by_model.setdefault(session.model, []).append(point.sct_s[session.session_id])
    return max(sorted(by_model), key=lambda m: percentile(by_model[m], 95))


def _runner(
    sessions: Sequence[SessionTrace],
    catalog: Catalog,
    server: str,
    profile: str,
    quantum_s: float,
    jobs: int,
    on_point: Callable[[Point], None] | None,
) -> Replayer:
    """Replays of (family, layout) pairs, ``jobs`` at a time in worker processes."""

    def run(layouts: Sequence[tuple[str, tuple[tuple[str, ...], ...]]]) -> list[Point]:
        args = [(f, sessions, catalog, server, profile, quantum_s, lay) for f, lay in layouts]
        if jobs <= 1 or len(args) <= 1:
            points = []
            for a in args:
                points.append(replay_layout(*a))
                if on_point:
                    on_point(points[-1])
            return points
        # spawned, not forked: the parent may hold threads (a progress bar's, a test's loop)
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(replay_layout, *a) for a in args]
            points = []
            for future in futures:
                points.append(future.result())
                if on_point:
                    on_point(points[-1])
            return points

    return run
