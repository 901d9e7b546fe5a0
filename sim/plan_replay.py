"""One replay of a layout for ``talaria plan`` (sim/plan.py) and its verdict: the layout to
replay (``Candidate``, under its family's policy), what it gave (``Point``: SCTs, each model's
p95, its weights' loads by tier), whether it meets the SLO's per-model bounds (``meets``,
``overage``, ``worst_model``, ``cheapest``), and the runner that replays candidates ``jobs`` at a
time in worker processes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any

from talaria.core.catalog import Catalog
from talaria.core.trace import SessionTrace
from talaria.sim.experiment import ExperimentSetup, run_experiment
from talaria.sim.metrics import percentile
from talaria.sim.placement import Layout
from talaria.sim.plan_figures import groups_of, loads_by_tier

POLICY = "talaria"
"""The replay policy of every layout but ``serverless``'s (sim/policies.py): its router and
node scheduler."""
SERVERLESS = "serverless"
"""The ``serverless`` family's replay policy: request-level instances with a fixed keep-alive,
no session awareness (sim/policies.py)."""


@dataclass(frozen=True)
class Candidate:
    """A layout to replay: its family, the models of each node and each node's GPUs."""

    family: str
    layout: Layout
    gpus: tuple[int, ...]
    search: str = ""
    """Which search of its family made it (``pool``: sim/plan_pool.py; ``moves``)."""

    @property
    def policy(self) -> str:
        """The replay policy of its family."""
        return SERVERLESS if self.family == SERVERLESS else POLICY


@dataclass(frozen=True)
class Point:
    """One replay of the plan: a layout, its nodes' GPUs and the SCTs it gave."""

    family: str
    layout: Layout
    gpus_per_node: tuple[int, ...]
    p50_sct_s: float
    p95_sct_s: float
    mean_sct_s: float
    p95_by_model: Mapping[str, float]
    sct_s: Mapping[str, float] = field(default_factory=dict)
    weight_loads: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Per model, its weights' loads into HBM by the tier read from (the replay's)."""
    search: str = ""
    """Which search of its family made it (``Candidate.search``)."""

    @property
    def nodes(self) -> int:
        return len(self.layout)

    @property
    def gpus(self) -> int:
        return sum(self.gpus_per_node)

    def summary(self) -> dict[str, Any]:
        """The point without its per-session SCTs (for documents and tables)."""
        return {
            "family": self.family,
            "search": self.search,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "layout": [list(models) for models in self.layout],
            "gpus_per_node": list(self.gpus_per_node),
            "groups": groups_of(self.layout, self.gpus_per_node),
            "p50_sct_s": self.p50_sct_s,
            "p95_sct_s": self.p95_sct_s,
            "mean_sct_s": self.mean_sct_s,
            "p95_by_model": dict(self.p95_by_model),
            "weight_loads": {m: dict(tiers) for m, tiers in self.weight_loads.items()},
            "loads_by_tier": loads_by_tier(self.weight_loads),
        }


def replay_layout(
    candidate: Candidate,
    sessions: Sequence[SessionTrace],
    catalog: Catalog,
    server: str,
    profile: str,
    quantum_s: float,
) -> Point:
    """Replay ``sessions`` on the candidate's layout under its family's policy."""
    layout, gpus = candidate.layout, candidate.gpus
    models = tuple(dict.fromkeys(m for node in layout for m in node))
    whole = catalog.server(server).gpus
    groups = None if all(g == whole for g in gpus) else gpus
    setup = ExperimentSetup(server, profile, models, len(layout), quantum_s, layout, groups)
    policy = candidate.policy
    doc = run_experiment(
        sessions, catalog, setup, [policy], include_dedicated=False, include_oracle=False
    )
    result = doc["policies"][policy]
    return Point(
        candidate.family,
        layout,
        gpus,
        result["p50_sct_s"],
        result["p95_sct_s"],
        result["mean_sct_s"],
        p95_by_model(result["sct_s"], sessions),
        result["sct_s"],
        result["weight_loads"],
        candidate.search,
    )


def p95_by_model(sct_s: Mapping[str, float], sessions: Sequence[SessionTrace]) -> dict[str, float]:
    """Each model's sessions' p95 SCT."""
    by_model: dict[str, list[float]] = {}
    for session in sessions:
        by_model.setdefault(session.model, []).append(sct_s[session.session_id])
    return {m: percentile(scts, 95) for m, scts in sorted(by_model.items())}


def dedicated_layout(
    replicas: Mapping[str, int], sizes: Mapping[str, int]
) -> tuple[Layout, tuple[int, ...]]:
    """Each model on ``replicas[m]`` groups of ``sizes[m]`` GPUs of its own."""
    nodes = [(m, sizes[m]) for m, count in replicas.items() for _ in range(count)]
    return tuple((m,) for m, _ in nodes), tuple(size for _, size in nodes)


def overage(point: Point, bounds: Mapping[str, float]) -> dict[str, float]:
    """Each model's p95 ÷ its bound (≤ 1: the model meets the SLO)."""
    return {m: point.p95_by_model[m] / bound for m, bound in bounds.items()}


def meets(point: Point, bounds: Mapping[str, float]) -> bool:
    """Every model's p95 within its bound."""
    return all(ratio <= 1.0 for ratio in overage(point, bounds).values())


def cheapest(points: Iterable[Point], bounds: Mapping[str, float]) -> Point | None:
    """The evaluated point with the fewest GPUs (then nodes) that meets ``bounds`` (None:
    none does)."""
    meeting = [p for p in points if meets(p, bounds)]
    return min(meeting, key=lambda p: (p.gpus, p.nodes)) if meeting else None


def worst_model(point: Point, bounds: Mapping[str, float]) -> str:
    """The model furthest over its bound (ties: the first by name)."""
    ratios = overage(point, bounds)
    return max(sorted(ratios), key=lambda m: ratios[m])


Replayer = Callable[[Sequence[Candidate]], list[Point]]
Moved = tuple[Layout, tuple[int, ...]]


def runner(
    sessions: Sequence[SessionTrace],
    catalog: Catalog,
    server: str,
    profile: str,
    quantum_s: float,
    jobs: int,
    on_point: Callable[[Point], None] | None,
) -> Replayer:
    """Replays of candidates, ``jobs`` at a time in worker processes."""

    def run(candidates: Sequence[Candidate]) -> list[Point]:
        args = [(c, sessions, catalog, server, profile, quantum_s) for c in candidates]
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
