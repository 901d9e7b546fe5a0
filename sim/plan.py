"""How many GPUs a fleet needs to meet an SLO on its sessions' completion time (issues 28, 40).

The SLO is per model: each model's sessions' p95 SCT ≤ its bound, by default ``slo_x`` × that
model's p95 on the *reference*, every model alone on a whole node of its own (one each, never
switched: what serverful serving on whole nodes gives); or one absolute bound for every model
(``slo_p95_s``). A layout meets the SLO when every model does. Layouts are replayed (each
replay independent, ``jobs`` at a time), and each family's plan is its evaluated layout with the
fewest GPUs that meets the SLO (Talaria's: of its shared groups, the whole-node packings and
the dedicated groups, all served under its policy):

- ``talaria``: GPU groups shared: first the market's tail pooled on a few whole nodes
  (sim/plan_pool.py: the coldest models that leave the ``dedicated`` plan's groups for k
  nodes, the most that still meet the SLO for each k); then, from the ``dedicated`` plan, or
  the cheapest of those pools where it has fewer GPUs (sim/placement.py ``share_group``),
  each model alone on a group, coldest first, moves into the group of another
  (resident together where their memory allows, else time-sharing it in slots with SP
  admission, host KV and staging: the ``talaria`` policy); a move is kept when the replay
  still meets the SLO and dropped when not, and the next mover is tried (``jobs`` at a time);
- ``serverless``: request-level instances (the ``serverless`` policy, sim/policies.py): its own
  right-sizing of dedicated groups (as ``dedicated``, under its policy, up to twice the
  ``dedicated`` plan's GPUs: past that its plan is None), then its tail pooled on a node or
  two (sim/plan_pool.py), as Talaria's;
- ``static``: the models packed onto ``n`` whole nodes by demand (sim/placement.py ``pack``),
  the ``talaria`` policy, the layout fixed for the whole trace (Talaria before GPU groups);
  counts are tried fewest first, ``jobs`` at a time, until one meets the SLO, up to the GPUs
  of the ``dedicated`` (or ``dedicated_node``) plan, whichever is fewer (a packing that needs
  more is never the cheapest layout, so its own plan is then None: more than those);
- ``dedicated``: every model on GPU groups of its own (core/groups.py), as an operator without
  Talaria deploys it: from each model on one group of the fewest GPUs that hold it (its
  weights and one full-context sequence's KV: the memory minimum), the model furthest over
  its bound (p95 ÷ bound) gets more, until the SLO is met: one more replica of its group, or
  groups twice as large, half as many rounded up (never more GPUs than the replica); both are
  replayed and the one whose worst model is better off is kept;
- ``dedicated_node``: every model on whole nodes of its own (the reference), one more node at
  a time for the model furthest over its bound.

Every layout evaluated is kept (``points``), so the GPUs needed for any other SLO are read off
the same replays (``cheapest``). One replay and its verdict: sim/plan_replay.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from talaria.core.catalog import Catalog
from talaria.core.groups import fit_together, smallest_group
from talaria.core.trace import SessionTrace
from talaria.sim.placement import (
    Layout,
    model_demand,
    movers,
    share_group,
    static_layouts,
    weight_room_bytes,
)
from talaria.sim.plan_figures import attainment
from talaria.sim.plan_pool import search_pools
from talaria.sim.plan_replay import (
    POLICY,
    SERVERLESS,
    Candidate,
    Moved,
    Point,
    Replayer,
    cheapest,
    dedicated_layout,
    meets,
    overage,
    runner,
    worst_model,
)

FAMILIES = ("talaria", "serverless", "static", "dedicated", "dedicated_node")


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
    """The plan's document (module docstring): the SLO (each model's bound), the reference,
    each family's plan (its fewest GPUs meeting the SLO: layout, groups and SCTs there, or
    None) and every point. ``max_nodes``: the most whole nodes' GPUs any family may use
    (default: twice the model count)."""
    limit = max_nodes or 2 * len(models)
    whole = catalog.server(server).gpus
    run = runner(sessions, catalog, server, profile, quantum_s, jobs, on_point)
    one_each = {m: 1 for m in models}
    node_sizes = {m: whole for m in models}
    [reference] = run([Candidate("dedicated_node", *dedicated_layout(one_each, node_sizes))])
    bounds = slo_bounds(reference.p95_by_model, slo_x, slo_p95_s)
    families: dict[str, list[Point]] = {"static": []}
    families["dedicated_node"] = more_nodes(reference, bounds, node_sizes, limit, run)
    minimum = {m: smallest_group(catalog.model(m), catalog.server(server)) for m in models}
    families["dedicated"] = search_dedicated(minimum, bounds, whole, limit * whole, run)
    start_from = cheapest(families["dedicated"], bounds)
    plans_so_far = (cheapest(families["dedicated_node"], bounds), start_from)
    found = [p.gpus for p in plans_so_far if p is not None]
    most = min(found) // whole if found else limit  # more whole nodes are never the cheapest
    layouts = list(static_layouts(sessions, catalog, server, profile, models, most).values())
    for start in range(0, len(layouts), jobs):  # in rounds of ``jobs``, fewest nodes first
        batch = layouts[start : start + jobs]
        families["static"] += run([Candidate("static", lay, (whole,) * len(lay)) for lay in batch])
        if any(meets(p, bounds) for p in families["static"]):
            break
    demand = {m: 0.0 for m in models}
    demand.update(model_demand(sessions, catalog, server, profile))
    weights = {m: catalog.model(m).weight_bytes for m in models}
    budget = weight_room_bytes(catalog, server)
    spec = catalog.server(server)

    def together(names: Sequence[str], size: int) -> bool:
        return fit_together([catalog.model(m) for m in names], spec, size)

    def move(layout: Layout, gpus: Sequence[int], model: str) -> Moved | None:
        return share_group(layout, gpus, model, demand, weights, minimum, budget, whole, together)

    most_gpus = 2 * start_from.gpus if start_from is not None else limit * whole
    own = search_dedicated(minimum, bounds, whole, most_gpus, run, SERVERLESS)
    starts = {"talaria": start_from, SERVERLESS: cheapest(own, bounds)}
    pools: dict[str, list[Point]] = {"talaria": [], SERVERLESS: []}
    for family, first in ((f, p) for f, p in starts.items() if p is not None):

        def pool_meets(candidates: Sequence[Moved], family: str = family) -> list[bool]:
            points = run([Candidate(family, lay, gpus, "pool") for lay, gpus in candidates])
            pools[family].extend(points)
            return [meets(p, bounds) for p in points]

        layout, gpus = first.layout, first.gpus_per_node
        search_pools(layout, gpus, demand, weights, budget, whole, pool_meets)
    families[SERVERLESS] = own + pools[SERVERLESS]
    pooled = cheapest(pools["talaria"], bounds)  # the moves start there if it saves GPUs
    seed = pooled if pooled and (not start_from or pooled.gpus < start_from.gpus) else start_from
    families["talaria"] = pools["talaria"] + search_shared(seed, demand, move, bounds, jobs, run)
    plans: dict[str, dict[str, Any] | None] = {}
    for family in FAMILIES:
        chosen = cheapest(_candidates(family, families), bounds)
        plans[family] = None
        if chosen is not None:
            plans[family] = {
                **chosen.summary(),
                "slo_by_model": attainment(chosen.p95_by_model, bounds),
            }
    return {
        "slo": {
            "x": None if slo_p95_s is not None else slo_x,
            "p95_sct_s": slo_p95_s,
            "by_model": bounds,
        },
        "reference": reference.summary(),
        "memory_minimum": {"gpus": sum(minimum.values()), "group_gpus": minimum},
        "plans": plans,
        "points": [p.summary() for family in FAMILIES for p in families[family]],
        "max_nodes": limit,
        "static_max_nodes": most,
        "serverless_max_gpus": most_gpus,
        "gpus_per_node": whole,
        "policy": POLICY,
        "serverless_policy": SERVERLESS,
    }


def slo_bounds(
    reach: Mapping[str, float], slo_x: float, slo_p95_s: float | None
) -> dict[str, float]:
    """Each model's p95 SCT bound: ``slo_p95_s`` for every model if given, else ``slo_x`` × its
    p95 on the reference (a whole node of its own, ``reach``)."""
    return {m: slo_p95_s if slo_p95_s is not None else slo_x * reach[m] for m in reach}


def more_nodes(
    reference: Point, bounds: Mapping[str, float], sizes: Mapping[str, int], limit: int,
    run: Replayer,
) -> list[Point]:  # fmt: skip
    """``dedicated_node``: from the reference, one more whole node at a time for the model
    furthest over its bound, until the SLO is met or ``limit`` nodes are used."""
    points = [reference]
    replicas = {m: 1 for m in sizes}
    while not meets(points[-1], bounds) and sum(replicas.values()) < limit:
        replicas[worst_model(points[-1], bounds)] += 1
        points += run([Candidate("dedicated_node", *dedicated_layout(replicas, sizes))])
    return points


def _candidates(family: str, families: Mapping[str, list[Point]]) -> list[Point]:
    """The points a family's plan is chosen from: its own; Talaria's all the layouts it can
    serve under its policy: its shared groups, the whole-node packings (groups of 8 are groups
    too) and the dedicated groups (a group of one model is a group too)."""
    if family == "talaria":
        return [*families["talaria"], *families["static"], *families["dedicated"]]
    return families[family]


def search_shared(
    start: Point | None,
    demand: Mapping[str, float],
    move: Callable[[Layout, Sequence[int], str], Moved | None],
    bounds: Mapping[str, float],
    jobs: int,
    run: Replayer,
) -> list[Point]:
    """``talaria``: from the dedicated plan's groups (the same replay: no group switches),
    each mover in turn (sim/placement.py ``movers``, coldest first) into its host's group
    (``move``), a move kept while its replay meets the SLO and dropped when it does not.
    ``jobs`` movers are replayed at a time, each from the layout kept so far: of those that
    meet, the one with the fewest GPUs is kept and the others are tried again from it."""
    if start is None:
        return []
    kept = replace(start, family="talaria", search="moves")
    points, queue = [kept], movers(kept.layout, demand)
    while queue:
        batch: list[tuple[str, Moved]] = []
        while queue and len(batch) < jobs:
            model = queue.pop(0)
            moved = move(kept.layout, kept.gpus_per_node, model)
            if moved is not None:
                batch.append((model, moved))
        tried = run([Candidate("talaria", *moved, "moves") for _, moved in batch])
        points += tried
        passed = [i for i, point in enumerate(tried) if meets(point, bounds)]
        if passed:
            best = min(passed, key=lambda i: (tried[i].gpus, i))
            kept = tried[best]
            again = [batch[i][0] for i in passed if i != best]
            queue = [m for m in [*again, *queue] if m in movers(kept.layout, demand)]
    return points


def search_dedicated(
    minimum: Mapping[str, int], bounds: Mapping[str, float], whole: int, max_gpus: int,
    run: Replayer, family: str = "dedicated",
) -> list[Point]:  # fmt: skip
    """``dedicated`` (or ``family``'s own right-sizing, under its policy): from every model on
    one group of its memory minimum, more for the model furthest over its bound (module
    docstring) until the SLO is met or ``max_gpus`` would be passed. Its ``r`` groups of ``s``
    GPUs become ``r + 1`` groups, or ``⌈r/2⌉`` groups of ``2s`` (never more GPUs than ``r + 1``
    of ``s``); both are replayed and the layout whose worst model is better off is kept.
    Groups only grow, so the halved replicas never loop."""
    sizes, replicas = dict(minimum), {m: 1 for m in minimum}
    [point] = run([Candidate(family, *dedicated_layout(replicas, sizes), "groups")])
    points = [point]
    while not meets(point, bounds):
        worst = worst_model(point, bounds)
        if point.gpus + sizes[worst] > max_gpus:
            break
        options = [(sizes, {**replicas, worst: replicas[worst] + 1})]
        if 2 * sizes[worst] <= whole:
            larger = {**replicas, worst: -(-replicas[worst] // 2)}
            options.append(({**sizes, worst: 2 * sizes[worst]}, larger))
        tried = run([Candidate(family, *dedicated_layout(r, s), "groups") for s, r in options])
        points += tried
        best = min(range(len(tried)), key=lambda i: max(overage(tried[i], bounds).values()))
        point, (sizes, replicas) = tried[best], options[best]
    return points
