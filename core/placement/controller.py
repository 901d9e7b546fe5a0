"""The placement controller: which models each node hosts, decided from measured demand (pure).

Terms, for one look (``decide``) at the fleet:

- ``d_m``, a model's *demand*: the sessions that sent it a call within the measuring window;
- ``r_m``, its *replicas*: the nodes that host it or are receiving it, not those draining it;
  each is assumed to take an equal share ``s_m = d_m / r_m`` of its sessions;
- a node's *wait* ``W_i``: a node time-shares its models in slots, so a session waits while
  the node's other models hold it and while its own model switches in. With ``A_i`` the
  models of node ``i`` with demand, ``k_i = |A_i|``, ``S_i = Σ_{A_i} s_m``, model ``m``
  serving for a slot sized as the scheduler sizes it (runtime/scheduling/slots.py
  ``slot_length_s``) but never shorter than its calls, which a closing slot lets finish
  (``c_m``, their measured mean duration), ``u_m = max(Q · clamp(k_i · s_m / S_i, ½, 2), c_m)``,
  after a switch of ``w_m`` (its weights woken over PCIe), a round lasts
  ``L_i = Σ_{A_i} (u_m + w_m)`` and

      W_i = Σ_{m ∈ A_i} s_m · (L_i − u_m) / L_i

  — the sessions waiting at any moment, on average (each waits the round but its own
  model's serving time). A node serving one model waits for nothing (W = 0) however busy it
  is: batching serves its sessions together, and the controller does not model a node's
  compute running out.

Rules, each move with its reason:

0. **scale to zero** (not bounded): a replica of a model with a keep-alive (learned from its
   own calls, core/placement/keep_alive.py) is evicted from its node once the model has had
   no call for that long, has no live session there and was placed at least that long ago;
   the model stays listed and its next call is a cold start (rule 1);
1. **cold start** (not bounded): a model with calls waiting and no replica is placed on the
   node where it adds the least wait, among those where its weights fit the node's budget
   after evicting *idle* models there (no call in a whole window, no live session on that
   node), largest weights first;
2. **improve** (bounded): of every *scale out* (a replica of ``m`` on node ``t``), *move*
   (``m`` onto ``t``, and drained from ``i``) and *scale in* (``m`` drained from ``i`` while
   it has another replica), the one that lowers ``W = Σ W_i`` the most is made if it lowers
   it by at least ``hysteresis`` × the wait of the node it relieves and by at least
   ``min_gain`` sessions (a move costs sessions their KV and a node its engine's start: one
   that spares less than one waiting session is not worth it). Draining needs the
   replica placed ``min_hold_s`` ago or more; a drained node takes no new session of the
   model, and its sessions there stay until they end or ``drain_s`` passes.

Bounded moves take at most ``max_moves_per_hour`` over any trailing hour and at most one per
look; a cold start and the evictions it needs are not bounded (a call waits). A placement's
source is a peer that hosts the model (its host memory over the fabric), else storage; the
cost of each is the server's (core/server_spec.py ``ServerSpec.placement_s``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class MoveKind(StrEnum):
    """What a move does to a node's models."""

    ADD = "add"
    DRAIN = "drain"
    """Stop sending it new sessions; remove it once its sessions are gone."""
    EVICT = "evict"
    """Remove an idle model at once (no live session of it on the node)."""


class Reason(StrEnum):
    """Why a move was made (the module docstring's rules)."""

    COLD_START = "cold-start"
    SCALE_TO_ZERO = "scale-to-zero"
    SCALE_OUT = "scale-out"
    SCALE_IN = "scale-in"
    MOVE = "move"
    ROOM = "room"


@dataclass(frozen=True)
class PlacementConfig:
    """The controller's knobs (module docstring); times in seconds."""

    interval_s: float = 60.0
    """How often the controller looks."""
    window_s: float = 300.0
    """Demand is measured over the calls that arrived this long back."""
    hysteresis: float = 0.2
    """A bounded move must lower the fleet's wait by at least this × its source node's."""
    min_gain: float = 1.0
    """... and by at least this many waiting sessions."""
    max_moves_per_hour: int = 12
    min_hold_s: float = 900.0
    """A replica stays at least this long before it may be given back."""
    drain_s: float = 600.0
    """A draining model's sessions move (their next call goes elsewhere) after this long."""


@dataclass(frozen=True)
class NodeView:
    """One node as the controller sees it: the models it serves or receives, those it drains,
    the host memory its models' weights may use, and when each replica was placed."""

    name: str
    hosted: frozenset[str]
    """Serving, or receiving (weights on the way): counted as replicas."""
    draining: frozenset[str] = frozenset()
    budget_bytes: float = float("inf")
    placed_s: Mapping[str, float] = field(default_factory=dict)
    """Model → when it was placed here (absent: from the start)."""
    live: Mapping[str, int] = field(default_factory=dict)
    """Model → sessions whose last call ran here and that have not ended."""
    too_small: frozenset[str] = frozenset()
    """Models this node's GPU group cannot hold (core/groups.py: their smallest group is
    larger): never added here."""


@dataclass(frozen=True)
class FleetView:
    """What one look reads: the time, the nodes, each model's demand and weights, the models
    with calls waiting for a replica, and when the recent bounded moves were made."""

    now_s: float
    nodes: Sequence[NodeView]
    demand: Mapping[str, float]
    weight_bytes: Mapping[str, float]
    unplaced_waiting: frozenset[str] = frozenset()
    recent_moves_s: Sequence[float] = ()
    measured_s: float = float("inf")
    """How long demand has been measured: no model is idle before a whole window."""
    call_s: Mapping[str, float] = field(default_factory=dict)
    """Model → mean duration of its recent calls (``c_m``; absent: 0)."""
    switch_s: Mapping[str, float] = field(default_factory=dict)
    """Model → seconds to switch it in on a node (``w_m``; absent: 0)."""
    quantum_s: float = 60.0
    """The nodes' slot quantum ``Q``."""
    idle_s: Mapping[str, float] = field(default_factory=dict)
    """Model → seconds since its last call (absent: none since demand was measured)."""
    keep_alive_s: Mapping[str, float] = field(default_factory=dict)
    """Model → its keep-alive (core/placement/keep_alive.py); absent: it never scales to
    zero."""


@dataclass(frozen=True)
class Move:
    """One change to a node's models, with its reason and, for an add, its source (a peer
    node's name, or None for storage)."""

    kind: MoveKind
    model: str
    node: str
    reason: Reason
    source: str | None = None


def replicas(nodes: Sequence[NodeView]) -> dict[str, int]:
    """``r_m``: per model, the nodes hosting or receiving it (not draining it)."""
    count: dict[str, int] = {}
    for node in nodes:
        for model in node.hosted:
            count[model] = count.get(model, 0) + 1
    return count


def node_wait(
    shares: Mapping[str, float],
    call_s: Mapping[str, float],
    quantum_s: float,
    switch_s: Mapping[str, float] | None = None,
) -> float:
    """``W_i`` (module docstring) of a node whose models have the sessions ``shares``."""
    active = {m: s for m, s in shares.items() if s > 0}
    k, total = len(active), sum(active.values())
    if k < 2:
        return 0.0
    serve = {
        m: max(quantum_s * min(2.0, max(0.5, k * s / total)), call_s.get(m, 0.0))
        for m, s in active.items()
    }
    switches = switch_s or {}
    round_s = sum(serve[m] + switches.get(m, 0.0) for m in active)
    return sum(s * (round_s - serve[m]) for m, s in active.items()) / round_s


def decide(view: FleetView, config: PlacementConfig) -> list[Move]:
    """The moves of one look (module docstring), in the order they should be made."""
    plan = _Plan(view, config)
    plan.scale_to_zero()
    for model in sorted(view.unplaced_waiting):
        if plan.replicas.get(model, 0) == 0:
            plan.cold_start(model)
    hour_ago = view.now_s - 3600.0
    bounded = sum(1 for t in view.recent_moves_s if t > hour_ago)
    if bounded < config.max_moves_per_hour:
        _improve(plan, config)
    return plan.moves


class _Plan:
    """A working copy of the fleet that records the moves made on it."""

    def __init__(self, view: FleetView, config: PlacementConfig) -> None:
        self.view = view
        self.config = config
        self.hosted = {n.name: set(n.hosted) for n in view.nodes}
        self.nodes = {n.name: n for n in view.nodes}
        self.replicas = replicas(view.nodes)
        self.moves: list[Move] = []

    def demand(self, model: str) -> float:
        return self.view.demand.get(model, 0.0)

    def wait(self, node: str) -> float:
        """``W_i`` of ``node`` as planned."""
        return self.node_wait({m: self.demand(m) / self.replicas[m] for m in self.hosted[node]})

    def node_wait(self, shares: Mapping[str, float]) -> float:
        return node_wait(shares, self.view.call_s, self.view.quantum_s, self.view.switch_s)

    def used_bytes(self, node: str) -> float:
        held = self.hosted[node] | self.nodes[node].draining
        return sum(self.view.weight_bytes[m] for m in held)

    def idle(self, node: str) -> list[str]:
        """Models that could be evicted from ``node``: no call in a whole window, no live
        session there; largest weights first."""
        if self.view.measured_s < self.config.window_s:
            return []
        live = self.nodes[node].live
        found = [m for m in self.hosted[node] if self.demand(m) == 0 and live.get(m, 0) == 0]
        return sorted(found, key=lambda m: (-self.view.weight_bytes[m], m))

    def room_after_evictions(self, node: str, model: str) -> list[str] | None:
        """The idle models to evict so ``model`` fits on ``node`` (None: it cannot, the node's
        GPU group too small among the reasons)."""
        view = self.nodes[node]
        if model in self.hosted[node] or model in view.draining or model in view.too_small:
            return None
        free = self.nodes[node].budget_bytes - self.used_bytes(node)
        need = self.view.weight_bytes[model]
        evict: list[str] = []
        for idle in self.idle(node):
            if free >= need:
                break
            evict.append(idle)
            free += self.view.weight_bytes[idle]
        return evict if free >= need else None

    def add(self, model: str, node: str, reason: Reason) -> None:
        """Add ``model`` to ``node``, evicting the idle models its room needs."""
        evict = self.room_after_evictions(node, model)
        assert evict is not None, (model, node)
        for idle in evict:
            self.hosted[node].discard(idle)
            self.replicas[idle] -= 1
            self.moves.append(Move(MoveKind.EVICT, idle, node, Reason.ROOM))
        peers = sorted(n for n, models in self.hosted.items() if model in models)
        self.hosted[node].add(model)
        self.replicas[model] = self.replicas.get(model, 0) + 1
        self.moves.append(Move(MoveKind.ADD, model, node, reason, peers[0] if peers else None))

    def drain(self, model: str, node: str, reason: Reason) -> None:
        self.hosted[node].discard(model)
        self.replicas[model] -= 1
        self.moves.append(Move(MoveKind.DRAIN, model, node, reason))

    def scale_to_zero(self) -> None:
        """Rule 0: evict each replica idle for its model's keep-alive."""
        view = self.view
        for node in sorted(self.hosted):
            live, placed = self.nodes[node].live, self.nodes[node].placed_s
            for model in sorted(self.hosted[node]):
                keep = view.keep_alive_s.get(model)
                if keep is None or model in view.unplaced_waiting or live.get(model, 0) > 0:
                    continue
                idle = view.idle_s.get(model, view.measured_s)
                since = view.now_s - placed.get(model, view.now_s - view.measured_s)
                if idle >= keep and since >= keep:
                    self.hosted[node].discard(model)
                    self.replicas[model] -= 1
                    self.moves.append(Move(MoveKind.EVICT, model, node, Reason.SCALE_TO_ZERO))

    def cold_start(self, model: str) -> None:
        """Rule 1: the node where ``model`` adds the least wait, if it fits anywhere."""
        options = [n for n in self.hosted if self.room_after_evictions(n, model) is not None]
        if not options:
            return
        share = max(self.demand(model), 1.0)

        def added(node: str) -> float:
            shares = {m: self.demand(m) / self.replicas[m] for m in self.hosted[node]}
            return self.node_wait({**shares, model: share}) - self.node_wait(shares)

        self.add(model, min(options, key=lambda n: (added(n), n)), Reason.COLD_START)

    def drainable(self, model: str, node: str) -> bool:
        placed = self.nodes[node].placed_s.get(model, float("-inf"))
        return self.view.now_s - placed >= self.config.min_hold_s


def _improve(plan: _Plan, config: PlacementConfig) -> None:
    """Rule 2: the best scale out, move or scale in, if it gains enough."""
    before = {n: plan.wait(n) for n in plan.hosted}
    total = sum(before.values())
    best: tuple[float, str, str, str | None, str | None] | None = None
    # (gain, reason, model, add_to, drain_from)
    for source in sorted(plan.hosted):
        for model in sorted(plan.hosted[source]):
            if plan.demand(model) <= 0:
                continue
            r = plan.replicas[model]
            can_drain = plan.drainable(model, source)
            options: list[tuple[str, str | None, str | None]] = []
            if can_drain and r >= 2:
                options.append((Reason.SCALE_IN, None, source))
            for target in sorted(plan.hosted):
                if plan.room_after_evictions(target, model) is None:
                    continue
                options.append((Reason.SCALE_OUT, target, None))
                if can_drain:
                    options.append((Reason.MOVE, target, source))
            for reason, add_to, drain_from in options:
                after = _total_after(plan, model, add_to, drain_from)
                gain = total - after
                if gain < max(config.hysteresis * before[source], config.min_gain):
                    continue
                if best is None or gain > best[0]:
                    best = (gain, reason, model, add_to, drain_from)
    if best is None:
        return
    _, reason, model, add_to, drain_from = best
    if add_to is not None:
        plan.add(model, add_to, Reason(reason))
    if drain_from is not None:
        plan.drain(model, drain_from, Reason(reason))


def _total_after(plan: _Plan, model: str, add_to: str | None, drain_from: str | None) -> float:
    """``W`` once ``model`` is added to ``add_to`` and drained from ``drain_from`` (evictions
    of idle models change no wait: they have no demand)."""
    r = dict(plan.replicas)
    r[model] += (add_to is not None) - (drain_from is not None)
    hosted = {n: set(ms) for n, ms in plan.hosted.items()}
    if add_to is not None:
        hosted[add_to].add(model)
    if drain_from is not None:
        hosted[drain_from].discard(model)
    return sum(
        plan.node_wait({m: plan.demand(m) / r[m] for m in models}) for models in hosted.values()
    )
