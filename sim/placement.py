"""A static packing of a fleet's models onto nodes by demand (issue 28).

Demand of model m: ``D_m = Σ`` over its sessions of their calls' service time alone on a node
(the oracle's sum, sim/oracle.py, less the tool gaps): GPU-node seconds of work. A model on
``r_m`` nodes puts ``D_m / r_m`` on each; a node's load is the sum over its models.

``pack`` (greedy, deterministic):

1. models by demand, largest first, each onto the feasible node with the least load (ties:
   the lower index). Feasible: the model is not there yet, and the node's models' weights,
   with this one's, fit ``weight_budget_bytes`` (their pinned host copies: a node can wake
   any model it hosts, runtime/memory/sizing.py ``node_memory``);
2. then, while it lowers the largest node load, the heaviest share ``D_m / r_m`` on the most
   loaded node gets one more replica, on the least loaded feasible node.

``weight_budget_bytes``: host DRAM × (1 − reserve) less the host KV tier a node keeps
(runtime/memory/sizing.py ``pinned_weight_budget_bytes``).

``share_group`` (issue 40) packs GPU groups instead of whole nodes: from each model on groups
of its own (core/groups.py), a model alone on one group moves into the group of another, so
that the two share that group (resident together, or time-sharing it in slots); sim/plan.py
tries the movers in turn and keeps each move whose replay still meets the SLO:

1. movers (``movers``): models by demand, smallest first, each on exactly one group that hosts
   it alone;
2. its host: of the other groups, those at least its smallest group (its weights and one
   full-context sequence fit: ``minimum``) whose models' weights, with its own, fit the
   group's share of the weights a node keeps to wake from (``weight_room_bytes``: its local
   NVMe, else its pinned-weight budget; ``budget_bytes`` × size ÷ the node's GPUs; which of
   them keep host-DRAM copies is the node's, runtime/memory/host_weights.py); first those
   where all can stay resident together (``together``: no switch, only
   the GPUs shared), then the one with the least load (ties: the lower index); none: the
   model stays alone;
3. its own group is freed: each step needs its group's GPUs fewer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from talaria.core.catalog import Catalog
from talaria.core.trace import SessionTrace
from talaria.runtime.costmodel import CostModel
from talaria.runtime.memory.sizing import pinned_weight_budget_bytes
from talaria.sim.oracle import oracle_sct_s


class NoPlacement(ValueError):
    """The models cannot all be placed on so few nodes (their weights do not fit)."""


def model_demand(
    sessions: Sequence[SessionTrace], catalog: Catalog, server: str, profile: str
) -> dict[str, float]:
    """``D_m`` (module docstring), seconds, for every model with sessions."""
    costs: dict[str, CostModel] = {}
    demand: dict[str, float] = {}
    for session in sessions:
        if session.model not in costs:
            costs[session.model] = CostModel(
                catalog.model(session.model), catalog.server(server), catalog.profile(profile)
            )
        gaps = sum(c.tool_gap_s or 0.0 for c in session.calls)
        alone = oracle_sct_s(session, costs[session.model]) - gaps
        demand[session.model] = demand.get(session.model, 0.0) + alone
    return demand


def weight_budget_bytes(catalog: Catalog, server: str) -> float:
    """The pinned weights a node can hold (module docstring)."""
    return pinned_weight_budget_bytes(catalog.server(server))


def weight_room_bytes(catalog: Catalog, server: str) -> float:
    """The weights a node can keep for its models to wake from (``share_group``): its local
    NVMe when the server has that tier (core/weight_tiers.py; models past the pinned budget
    wake from there, runtime/memory/host_weights.py), else its pinned-weight budget."""
    spec = catalog.server(server)
    if spec.nvme_read_bytes_per_s > 0:
        return spec.nvme_bytes
    return weight_budget_bytes(catalog, server)


Layout = tuple[tuple[str, ...], ...]


def movers(layout: Layout, demand: Mapping[str, float]) -> list[str]:
    """The models that may move into another group (module docstring, 1): each alone on
    exactly one group, by demand, smallest first (ties: by name)."""
    counts: dict[str, int] = {}
    for models in layout:
        for m in models:
            counts[m] = counts.get(m, 0) + 1
    alone = {models[0] for models in layout if len(models) == 1 and counts[models[0]] == 1}
    return sorted(alone, key=lambda m: (demand.get(m, 0.0), m))


def share_group(
    layout: Layout,
    gpus: Sequence[int],
    model: str,
    demand: Mapping[str, float],
    weight_bytes: Mapping[str, float],
    minimum: Mapping[str, int],
    budget_bytes: float,
    node_gpus: int,
    together: Callable[[Sequence[str], int], bool],
) -> tuple[Layout, tuple[int, ...]] | None:
    """The layout (and its groups' GPUs) with ``model``, one of ``movers``, moved into its
    host's group and its own group freed (module docstring, 2–3); None: no group holds it."""
    hosted = [list(models) for models in layout]
    sizes = list(gpus)
    replicas = {m: sum(m in models for models in hosted) for models in hosted for m in models}

    def load(i: int) -> float:
        return sum(demand.get(m, 0.0) / replicas[m] for m in hosted[i])

    def fits(i: int) -> bool:
        used = sum(weight_bytes[m] for m in hosted[i]) + weight_bytes[model]
        return sizes[i] >= minimum[model] and used <= budget_bytes * sizes[i] / node_gpus

    [own] = [i for i, models in enumerate(hosted) if model in models]
    hosts = [i for i in range(len(hosted)) if i != own and fits(i)]
    if not hosts:
        return None
    target = min(hosts, key=lambda i: (not together([*hosted[i], model], sizes[i]), load(i), i))
    hosted[target].append(model)
    del hosted[own], sizes[own]
    return tuple(tuple(models) for models in hosted), tuple(sizes)


def pack(
    demand: Mapping[str, float],
    weight_bytes: Mapping[str, float],
    nodes: int,
    budget_bytes: float,
) -> tuple[tuple[str, ...], ...]:
    """Each node's models (module docstring); ``NoPlacement`` if some model finds no node."""
    if nodes < 1:
        raise NoPlacement(f"need at least one node, got {nodes}")
    order = sorted(demand, key=lambda m: (-demand[m], m))
    hosted: list[list[str]] = [[] for _ in range(nodes)]
    replicas = dict.fromkeys(order, 0)

    def load(i: int) -> float:
        return sum(demand[m] / replicas[m] for m in hosted[i])

    def feasible(i: int, model: str) -> bool:
        used = sum(weight_bytes[m] for m in hosted[i])
        return model not in hosted[i] and used + weight_bytes[model] <= budget_bytes

    def least_loaded(model: str) -> int | None:
        options = [i for i in range(nodes) if feasible(i, model)]
        return min(options, key=lambda i: (load(i), i)) if options else None

    for model in order:
        target = least_loaded(model)
        if target is None:
            raise NoPlacement(
                f"{model} ({weight_bytes[model] / 1e9:.0f} GB) fits no node of {nodes}: "
                f"each holds at most {budget_bytes / 1e9:.0f} GB of pinned weights"
            )
        hosted[target].append(model)
        replicas[model] += 1
    while True:
        busiest = max(range(nodes), key=lambda i: (load(i), -i))
        peak = load(busiest)
        if peak <= 0:
            break
        heaviest = max(hosted[busiest], key=lambda m: (demand[m] / replicas[m], m))
        target = least_loaded(heaviest)
        if target is None:
            break
        hosted[target].append(heaviest)
        replicas[heaviest] += 1
        if max(load(i) for i in range(nodes)) >= peak:  # no better: undo and stop
            hosted[target].remove(heaviest)
            replicas[heaviest] -= 1
            break
    return tuple(tuple(models) for models in hosted)


def static_layouts(
    sessions: Sequence[SessionTrace],
    catalog: Catalog,
    server: str,
    profile: str,
    models: Sequence[str],
    max_nodes: int,
) -> dict[int, Layout]:
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
