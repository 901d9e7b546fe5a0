"""One replay experiment: several policies on the same sessions, plus the two references.

- each policy: the shared node(s) of the preset under that policy's router and scheduler flags
  (``sim/policies.py``);
- ``oracle``: every session alone on its own node, model resident, no queueing (``oracle``);
- ``dedicated``: each model on a node of its own (same engine, batching and flags as
  ``talaria``), never switched: the distance to it is the cost of multiplexing.

The result is a JSON-ready dict; it holds no wall-clock figures, so the same inputs and seed
give the identical document.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from talaria.core.catalog import Catalog
from talaria.core.gap_model import GapQuality
from talaria.core.placement import PlacementConfig
from talaria.core.routing import RoutingConfig
from talaria.core.trace import SessionTrace
from talaria.core.types import CallResult, KvSource
from talaria.runtime.costmodel import CostModel
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import TALARIA
from talaria.runtime.scheduling.state import SlotRecord
from talaria.runtime.sim_node import NodeSetup
from talaria.sim.metrics import mean, percentile, sct_summary
from talaria.sim.oracle import oracle_sct_s
from talaria.sim.policies import resolve_policy
from talaria.sim.replay import NodeOutcome, ReplayOutcome, SessionOutcome, Transport, replay

OnCall = Callable[[CallResult], None]


@dataclass(frozen=True)
class ExperimentSetup:
    """What an experiment replays on: the server and efficiency profile (catalog names), the
    workload's models, the shared nodes and their slot quantum (seconds), and the routing."""

    server: str
    profile: str
    models: tuple[str, ...]
    nodes: int = 1
    quantum_s: float = 60.0
    node_models: tuple[tuple[str, ...], ...] | None = None
    """Per-node model lists (a cluster whose nodes host subsets); None: ``nodes`` nodes that
    each host every model."""
    node_gpus: tuple[int, ...] | None = None
    """Per node, the GPU group it is (core/groups.py: 1, 2, 4 or 8 of the server's GPUs);
    None: every node is a whole server."""
    routing_seed: int = 0
    """Seed of the router's tie-break rng (``random.Random``), the same for every policy."""
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    """Scorer weights and reference scales of every router (recorded in the document)."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """The placement controller's settings, for policies that run it (``placement``)."""
    tenant_weights: dict[str, float] = field(default_factory=dict)
    """Each tenant's share weight (absent: 1), as its API key gives it live."""

    def __post_init__(self) -> None:
        if self.node_gpus is not None and len(self.node_gpus) != self.nodes:
            raise ValueError(f"nodes={self.nodes} but {len(self.node_gpus)} node GPU counts")
        if self.node_models is None:
            if self.nodes < 1:
                raise ValueError(f"nodes must be >= 1, got {self.nodes}")
            return
        if self.nodes != len(self.node_models):
            raise ValueError(f"nodes={self.nodes} but {len(self.node_models)} node model lists")
        hosted = {m for models in self.node_models for m in models}
        if hosted != set(self.models):
            raise ValueError(
                f"node models {sorted(hosted)} must be exactly the workload's {sorted(self.models)}"
            )

    def layout(self) -> list[tuple[str, NodeSetup]]:
        """The shared nodes: ``node0``, ``node1``, ... with their model lists (and groups)."""
        per_node = self.node_models or (self.models,) * self.nodes
        gpus = self.node_gpus or (None,) * self.nodes
        return [
            (f"node{i}", NodeSetup(self.server, self.profile, models, gpus[i]))
            for i, models in enumerate(per_node)
        ]


def _summary(outcome: ReplayOutcome) -> dict[str, Any]:
    calls = [c for s in outcome.sessions for c in s.calls]
    slots = [(n.name, slot) for n in outcome.nodes for slot in n.slots]
    activations = len(slots)
    busy = sum(n.busy_s for n in outcome.nodes)
    span = outcome.makespan_s * max(1, len(outcome.nodes))
    reservations: dict[str, int] = {}
    for node in outcome.nodes:
        for reason, count in node.reservations.items():
            reservations[reason] = reservations.get(reason, 0) + count
    summary: dict[str, Any] = sct_summary([s.sct_s for s in outcome.sessions])
    summary.update(
        tenants=_groups(outcome.sessions, lambda s: s.tenant),
        classes=_groups(outcome.sessions, lambda s: s.priority.value),
    )
    summary.update(
        router=outcome.router,
        routing_reasons=outcome.routing_reasons,
        migrations=outcome.migrations,
        calls_completed=len(calls),
        sessions_completed=len(outcome.sessions),
        switches=sum(_switches(n.slots) for n in outcome.nodes),
        slots=activations,
        switch_s_total=sum(s.switch_s for _, s in slots),
        recomputed_tokens=sum(c.recomputed_tokens for c in calls),
        restored_bytes=sum(c.restored_bytes for c in calls),
        kv_sources={src.value: sum(1 for c in calls if c.kv_source is src) for src in KvSource},
        sp_admitted=sum(1 for c in calls if c.sp_admitted),
        gpu_busy_fraction=busy / span if span > 0 else 0.0,
        mean_queue_s=mean([c.queue_s for c in calls]),
        p50_ttft_s=percentile([c.first_token_s - c.arrival_s for c in calls], 50),
        makespan_s=outcome.makespan_s,
        peak_hbm_fraction=max(n.peak_hbm_bytes / n.hbm_capacity_bytes for n in outcome.nodes),
        reservations=reservations,
        reservation_gb_s=sum(n.reservation_byte_s for n in outcome.nodes) / 1e9,
        reservation_pinned_gb_s=sum(n.pinned_byte_s for n in outcome.nodes) / 1e9,
        reservations_expired_share=_expired_share(reservations),
        gap_models=_gap_models(outcome.nodes),
        weight_loads=_weight_loads(outcome.nodes),
        **_subagents(outcome.sessions),
        sct_s={s.session_id: s.sct_s for s in outcome.sessions},
        timeline=[
            {
                "node": node,
                "model": s.model,
                "start_s": s.start_s,
                "switch_s": s.switch_s,
                "end_s": s.end_s if s.end_s is not None else outcome.makespan_s,
                "close": s.close.value if s.close else None,
                "admitted": s.admitted,
                "sp_admitted": s.sp_admitted,
                "co_resident": list(s.co_resident),
            }
            for node, s in slots
        ],
    )
    return summary


def _subagents(sessions: Sequence[SessionOutcome]) -> dict[str, Any]:
    """With sub-agents: ``{"subagents": ...}``, their sessions, p50 SCT, first calls whose
    prefix came from the parent's KV (``from_parent``, of ``first_calls``), the tokens those
    reused and every token their calls recomputed (sim/subagents.py); without, nothing."""
    children = [s for s in sessions if s.parent_session_id is not None]
    if not children:
        return {}
    firsts = [s.calls[0] for s in children]
    reused = [c for c in firsts if c.kv_source in (KvSource.HBM, KvSource.HOST)]
    return {
        "subagents": {
            "sessions": len(children),
            "p50_sct_s": percentile([s.sct_s for s in children], 50),
            "first_calls": len(firsts),
            "from_parent": len(reused),
            "reused_tokens": sum(c.cached_tokens for c in reused),
            "recomputed_tokens": sum(c.recomputed_tokens for s in children for c in s.calls),
        }
    }


def _gap_models(nodes: Sequence[NodeOutcome]) -> dict[str, dict[str, Any]]:
    """Per gap model the nodes kept: how well it predicted their sessions' gaps, over all of
    them (core/gap_model.py ``GapFigures``)."""
    merged: dict[str, GapQuality] = {}
    for node in nodes:
        for name, quality in node.gap_quality.items():
            merged.setdefault(name, GapQuality(quality.quantile)).merge(quality)
    return {name: asdict(quality.figures()) for name, quality in merged.items()}


def _weight_loads(nodes: Sequence[NodeOutcome]) -> dict[str, dict[str, int]]:
    """Per model, its weights' loads into HBM by the tier read from, over all the nodes (the
    first load of a node's slot included: a cold start counts)."""
    loads: dict[str, dict[str, int]] = {}
    for node in nodes:
        for model, tiers in node.weight_loads.items():
            mine = loads.setdefault(model, {})
            for tier, n in tiers.items():
                mine[tier] = mine.get(tier, 0) + n
    return dict(sorted(loads.items()))


def _expired_share(reservations: dict[str, int]) -> float | None:
    """expired ÷ (returned + expired): the reservations that ran out before their session came
    back; None when none did either."""
    expired = reservations.get("expired", 0)
    settled = reservations.get("returned", 0) + expired
    return expired / settled if settled else None


def _groups(
    sessions: Sequence[SessionOutcome], key: Callable[[SessionOutcome], str]
) -> dict[str, dict[str, float]]:
    """Per tenant (or class): its sessions, p50/p95/mean SCT, its calls' mean queue wait
    (arrival to admission, slot wait included), their p50/p95 time to first token (arrival to
    first token) and their service seconds in all (admission to finish on the engine)."""
    grouped: dict[str, list[SessionOutcome]] = {}
    for session in sessions:
        grouped.setdefault(key(session), []).append(session)
    out: dict[str, dict[str, float]] = {}
    for name in sorted(grouped):
        members = grouped[name]
        calls = [c for s in members for c in s.calls]
        out[name] = {
            "sessions": len(members),
            **sct_summary([s.sct_s for s in members]),
            "mean_queue_s": mean([c.queue_s for c in calls]),
            **{
                f"p{q}_ttft_s": percentile([c.first_token_s - c.arrival_s for c in calls], q)
                for q in (50, 95)
            },
            "service_s": sum(c.finished_s - c.admitted_s for c in calls),
        }
    return out


def _switches(slots: Sequence[SlotRecord]) -> int:
    """Model activations on one node after the first slot's (cold loads, not switches)."""
    return sum(len(s.activated) for s in slots[1:])


def run_experiment(
    sessions: Sequence[SessionTrace],
    catalog: Catalog,
    setup: ExperimentSetup,
    policies: Sequence[str],
    on_call: OnCall | None = None,
    include_dedicated: bool = True,
    include_oracle: bool = True,
    config: SchedulerConfig | None = None,
) -> dict[str, Any]:
    """Replay every policy, the dedicated reference and the oracle bound on ``sessions``
    (without either when not wanted: a plan's many replays need neither); ``config``: the
    nodes' settings (None: the defaults with the setup's quantum)."""
    config = config or SchedulerConfig(quantum_s=setup.quantum_s)
    shared = setup.layout()
    seed = setup.routing_seed
    results: dict[str, dict[str, Any]] = {}
    for name in policies:
        policy = resolve_policy(name)
        outcome = replay(
            sessions,
            catalog,
            shared,
            policy.flags,
            config,
            on_call,
            router=policy.router,
            routing=policy.routing(setup.routing),
            routing_seed=seed,
            transport=Transport.of(catalog.profile(setup.profile)),
            placement=setup.placement if policy.placement else None,
            tenant_weights=setup.tenant_weights,
        )
        summary = _summary(outcome)
        summary["flags"] = asdict(policy.flags)
        if outcome.placement is not None:
            summary["placement"] = outcome.placement
        results[name] = summary
    document: dict[str, Any] = {
        "setup": asdict(setup),
        "sessions": len(sessions),
        "calls": sum(s.num_calls for s in sessions),
        "policies": results,
    }
    if include_oracle:
        document["oracle"] = _oracle(sessions, catalog, setup)
    if include_dedicated:
        per_model = [(m, NodeSetup(setup.server, setup.profile, (m,))) for m in setup.models]
        outcome = replay(
            sessions, catalog, per_model, TALARIA, config, on_call, routing=setup.routing
        )
        dedicated = _summary(outcome)
        document["dedicated"] = dedicated
    _add_ratios(document)
    return document


def _oracle(
    sessions: Sequence[SessionTrace], catalog: Catalog, setup: ExperimentSetup
) -> dict[str, Any]:
    server, profile = catalog.server(setup.server), catalog.profile(setup.profile)
    costs = {m: CostModel(catalog.model(m), server, profile) for m in setup.models}
    sct = {s.session_id: oracle_sct_s(s, costs[s.model]) for s in sessions}
    summary: dict[str, Any] = sct_summary(list(sct.values()))
    summary.update(calls_completed=sum(s.num_calls for s in sessions), sct_s=sct)
    return summary


def _add_ratios(document: dict[str, Any]) -> None:
    """speedup_p50/p95 = round's SCT percentile / this one's; oracle_ratio_p50/p95 = this
    one's / the oracle's (≥ 1); for ``dedicated``, talaria's p50 / dedicated's."""
    oracle = document.get("oracle")
    base = document["policies"].get("round")
    targets = [*document["policies"].values()]
    if "dedicated" in document:
        targets.append(document["dedicated"])
    for summary in targets:
        for q in ("p50", "p95"):
            key = f"{q}_sct_s"
            summary[f"speedup_{q}"] = base[key] / summary[key] if base else None
            summary[f"oracle_ratio_{q}"] = summary[key] / oracle[key] if oracle else None
    talaria = document["policies"].get("talaria")
    if talaria and "dedicated" in document:
        dedicated = document["dedicated"]
        document["multiplexing_cost_p50"] = talaria["p50_sct_s"] / dedicated["p50_sct_s"]
        document["multiplexing_cost_p95"] = talaria["p95_sct_s"] / dedicated["p95_sct_s"]
