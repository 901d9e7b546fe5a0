"""Talaria's pooled layouts (issue 48): a market's tail time-shares a few whole nodes.

From the dedicated plan's layout, the models alone on exactly one group (sim/placement.py
``movers``) are ordered by demand, smallest first; the ``j`` coldest leave their groups for a
pool of ``k`` whole nodes, packed by demand (sim/placement.py ``pack``) within each node's
weight room (``weight_room_bytes``: its local NVMe, from which a model without a host copy
wakes), and every other model keeps its groups. Pools of ``k`` ≤ ``MAX_POOL_NODES`` are tried,
while their GPUs are fewer than the groups of every poolable model: a market's tail, cold most
of the time, is what a node or two should hold, and larger pools are the whole-node packings'
ground (sim/plan.py's ``static`` family). For each ``k`` the largest ``j`` whose
replay meets the SLO is found by bisection (pooling one more model only adds to the pool's
load: meeting is taken as monotone in ``j``), the ``k`` searches stepping together, ``jobs``
replays at a time, each layout once. Each pooled layout is a Talaria point (family
``talaria``); the cheapest that meets the SLO is where sim/plan.py's move search starts when
it has fewer GPUs than the dedicated plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from talaria.sim.placement import Layout, NoPlacement, movers, pack

MAX_POOL_NODES = 2
"""The largest pool tried (module docstring)."""

Replayer = Callable[[Sequence[tuple[Layout, tuple[int, ...]]]], list[bool]]
"""Replays layouts (each with its groups' GPUs); True for each that meets the SLO."""


def pooled(
    layout: Layout,
    gpus: Sequence[int],
    cold: Sequence[str],
    nodes: int,
    demand: Mapping[str, float],
    weight_bytes: Mapping[str, float],
    room_bytes: float,
    node_gpus: int,
) -> tuple[Layout, tuple[int, ...]] | None:
    """``layout`` with the models ``cold`` moved from their own groups onto ``nodes`` whole
    nodes packed by demand (None: their weights do not fit so few)."""
    try:
        pool = pack({m: demand.get(m, 0.0) for m in cold}, weight_bytes, nodes, room_bytes)
    except NoPlacement:
        return None
    kept = [(models, g) for models, g in zip(layout, gpus, strict=True) if models[0] not in cold]
    return (
        tuple(models for models, _ in kept) + pool,
        tuple(g for _, g in kept) + (node_gpus,) * nodes,
    )


def search_pools(
    layout: Layout,
    gpus: Sequence[int],
    demand: Mapping[str, float],
    weight_bytes: Mapping[str, float],
    room_bytes: float,
    node_gpus: int,
    meets: Replayer,
) -> None:
    """Replay the pooled layouts of the module docstring (through ``meets``, which keeps the
    points)."""
    poolable = movers(layout, demand)
    own = {models[0]: g for models, g in zip(layout, gpus, strict=True) if len(models) == 1}
    freed = sum(own[m] for m in poolable)
    pools = [k for k in range(1, MAX_POOL_NODES + 1) if k * node_gpus < freed]
    meeting = dict.fromkeys(pools, 0)  # the most models known to meet the SLO, pooled on k
    failing = dict.fromkeys(pools, len(poolable) + 1)  # the fewest known not to
    seen: dict[tuple[Layout, tuple[int, ...]], bool] = {}
    while True:
        tried: list[tuple[int, int, tuple[Layout, tuple[int, ...]]]] = []
        for k in pools:
            while failing[k] - meeting[k] > 1:
                j = (meeting[k] + failing[k]) // 2
                candidate = pooled(layout, gpus, poolable[:j], k, demand, weight_bytes,
                                   room_bytes, node_gpus)  # fmt: skip
                if candidate is not None:
                    tried.append((k, j, candidate))
                    break
                failing[k] = j  # their weights do not fit k nodes
        if not tried:
            return
        fresh = list({c: None for _, _, c in tried if c not in seen})  # each layout replayed once
        seen.update(zip(fresh, meets(fresh), strict=True))
        for k, j, candidate in tried:
            ok = seen[candidate]
            if ok:
                meeting[k] = j
            else:
                failing[k] = j
