"""Named replay setups: the workload, the server, the nodes and their models, the slot quantum,
and the policies compared by default."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from talaria.core.catalog import Catalog
from talaria.core.trace import SessionTrace
from talaria.core.types import Priority
from talaria.sim.experiment import ExperimentSetup
from talaria.sim.market import MarketSpec, aegaeon_head, market_sessions
from talaria.sim.placement import model_demand, pack, weight_budget_bytes
from talaria.sim.policies import CLUSTER_POLICIES, SINGLE_NODE_POLICIES
from talaria.sim.subagents import SubagentSpec, add_subagents
from talaria.sim.tenants import TenantLoad, mixed_sessions, union_workload
from talaria.sim.workload import PAPER_WORKLOAD, WorkloadSpec, generate_sessions


@dataclass(frozen=True)
class Preset:
    """A named replay setup (module docstring); ``quantum_s`` in seconds of virtual time."""

    name: str
    description: str
    workload: WorkloadSpec
    server: str = "h200x8"
    profile: str = "default"
    quantum_s: float = 60.0
    """Slot quantum of a contended slot. The paper does not state its round scheduler's slot
    length; 60 s is our default (about 7× the ~8.6 s sleep+wake switch of the paper trio, so
    switching costs at most ~13% of a contended round) and ``--sweep quantum_s=...`` varies it."""
    node_models: tuple[tuple[str, ...], ...] | None = None
    """Models of each node (node0, node1, ...); None: one node per ``--nodes``, each hosting
    every model of the workload."""
    policies: tuple[str, ...] = SINGLE_NODE_POLICIES
    """Policies replayed when none are named (``sim/policies.py``)."""
    packed_nodes: int | None = None
    """Nodes of a layout packed by the replayed sessions' demand (sim/placement.py ``pack``);
    None: the preset's own layout, or ``--nodes`` nodes each hosting every model."""
    tenants: tuple[TenantLoad, ...] = ()
    """Several tenants, each with a workload of its own (sim/tenants.py); ``workload`` is then
    their union (its models). Empty: one tenant, ``workload``'s sessions."""
    subagents: SubagentSpec | None = None
    """Sessions spawn sub-agents (sim/subagents.py); None: none do."""
    market: MarketSpec | None = None
    """Sessions arrive as in a market (sim/market.py): its listed models are ``workload``'s,
    whose distributions draw each session's calls; None: ``workload``'s own arrivals."""

    def sessions(self, catalog: Catalog, seed: int) -> list[SessionTrace]:
        """The preset's sessions drawn with ``seed``, sized by the catalog's models."""
        models = [catalog.model(m) for m in self.workload.models]
        windows = {m.name: m.context_window_tokens for m in models}
        reasoning = {m.name: m.reasoning for m in models}
        if self.tenants:
            return mixed_sessions(self.tenants, windows, reasoning, seed)
        if self.market is not None:
            return market_sessions(self.market, self.workload, windows, reasoning, seed)
        sessions = generate_sessions(self.workload, windows, reasoning, seed)
        if self.subagents is not None:
            return add_subagents(sessions, self.workload, self.subagents, windows, reasoning, seed)
        return sessions

    def with_sessions(self, sessions: int) -> Preset:
        """The preset with about ``sessions`` sessions: a market's rate scaled to that many
        over its duration; a workload's count, its calls per session kept."""
        if self.market is not None:
            rate = sessions / self.market.duration_s
            return replace(self, market=replace(self.market, sessions_per_s=rate))
        w = self.workload
        total = round(w.total_calls / w.sessions * sessions) if w.total_calls else None
        return replace(self, workload=replace(w, sessions=sessions, total_calls=total))

    def experiment_setup(
        self,
        nodes: int | None = None,
        sessions: Sequence[SessionTrace] | None = None,
        catalog: Catalog | None = None,
    ) -> ExperimentSetup:
        """The experiment of this preset; ``nodes`` applies to presets without their own node
        layout (every node hosting every model) and to packed ones (how many to pack onto,
        which needs the ``sessions`` and the ``catalog``)."""
        models = self.workload.models
        if self.packed_nodes is not None:
            if sessions is None or catalog is None:
                raise ValueError(f"preset {self.name!r} packs its nodes by the sessions' demand")
            count = nodes or self.packed_nodes
            demand = {m: 0.0 for m in models}
            demand.update(model_demand(sessions, catalog, self.server, self.profile))
            weights = {m: catalog.model(m).weight_bytes for m in models}
            layout = pack(demand, weights, count, weight_budget_bytes(catalog, self.server))
            return ExperimentSetup(
                self.server, self.profile, models, count, self.quantum_s, layout,
                tenant_weights=self.weights(),
            )  # fmt: skip
        if self.node_models is not None:
            return ExperimentSetup(
                self.server,
                self.profile,
                models,
                len(self.node_models),
                self.quantum_s,
                self.node_models,
                tenant_weights=self.weights(),
            )
        return ExperimentSetup(
            self.server, self.profile, models, nodes or 1, self.quantum_s,
            tenant_weights=self.weights(),
        )  # fmt: skip

    def weights(self) -> dict[str, float]:
        """Each tenant's share weight."""
        return {load.tenant: load.weight for load in self.tenants}


CLUSTER_MODELS: tuple[str, ...] = (
    "glm-4.5-fp8",
    "qwen3-235b-a22b-bf16",
    "qwen3-coder-480b-a35b-fp8",
    "gpt-oss-120b",
    "deepseek-v3-fp8",
    "llama-4-scout-bf16",
)
"""The six shipped models in Zipf rank order (session shares 41/20/14/10/8/7%). Each fits one
node's usable HBM (1,015 GB) alone with room for KV: the largest, DeepSeek-V3 (690 GB), leaves
325 GB, over four 131K-token contexts. None is dropped."""

CLUSTER_NODE_MODELS: tuple[tuple[str, ...], ...] = (
    ("glm-4.5-fp8", "gpt-oss-120b", "deepseek-v3-fp8"),
    ("glm-4.5-fp8", "deepseek-v3-fp8", "llama-4-scout-bf16"),
    ("qwen3-235b-a22b-bf16", "qwen3-coder-480b-a35b-fp8", "gpt-oss-120b"),
    ("qwen3-235b-a22b-bf16", "qwen3-coder-480b-a35b-fp8", "llama-4-scout-bf16"),
)
"""Three models per node, each model on two nodes. All six cannot share a node: their pinned
host weight copies total 2,278 GB against 1,800 GB of host DRAM (2 TB less the 10% reserve of
sim/replay.py). Of the assignments with every model on exactly two nodes, this one has the
smallest spread of expected session share per node (node0–3: 30/28/22/20%, half of each
hosted model's share) among those whose pinned copies leave every node ≥ 500 GB of host KV
(1,110 / 1,263 / 1,015 / 1,168 GB of weights)."""

CLUSTER_WORKLOAD = WorkloadSpec(
    sessions=120,
    models=CLUSTER_MODELS,
    total_calls=120 * 32,
    mean_interarrival_s=3.0,
)
"""120 sessions at the paper preset's 32 calls per session (3,840 calls, rescaled as there).
Poisson arrivals every 3 s on average (an assumption, as for the paper preset): about 20
sessions a minute over 4 nodes, close to the paper preset's load per node (6 a minute on one)."""


FLEET_MODELS: tuple[str, ...] = (
    "qwen3-coder-480b-a35b-fp8",
    "glm-4.6-fp8",
    "deepseek-v3.1",
    "kimi-k2-thinking",
    "minimax-m2",
    "qwen3-235b-a22b-instruct-2507-fp8",
    "gpt-oss-120b",
    "glm-4.5-fp8",
    "deepseek-r1-0528",
    "llama-4-maverick-fp8",
    "glm-4.5-air-fp8",
    "qwen3-235b-a22b-bf16",
    "deepseek-v3-fp8",
    "llama-3.1-405b-instruct-fp8",
    "llama-4-scout-bf16",
)
"""Fifteen catalog models of 106B–671B in Zipf rank order (an assumption: the newer coding
models first). Kimi-K2-Instruct is in the catalog but not here: its FP8 weights (1,029 GB)
exceed one 8×H200 node's usable HBM (1,015 GB); Kimi-K2-Thinking (INT4 experts, 594 GB) is.
Their pinned weights total 6,083 GB, so at least five nodes hold one copy of each
(sim/placement.py: 1,300 GB of pinned weights per node)."""

FLEET_WORKLOAD = WorkloadSpec(
    sessions=600,
    models=FLEET_MODELS,
    total_calls=600 * 32,
    mean_interarrival_s=1.5,
    day_s=900.0,
    diurnal_amplitude=0.8,
    bursts_per_day=4.0,
    burst_s=120.0,
    burst_factor=4.0,
)
"""600 sessions of 32 calls on average, Poisson arrivals every 1.5 s (40 a minute: over the
default 8 nodes, the cluster preset's 5 a minute per node). A "day" is compressed into the
sessions' 900 s span, so the hot set rotates once through the run (each model's share
swings ×(1 ± 0.8)) and four bursts put one model at 4× its share for 2 minutes each
(docs/sources.md §12: the shape is an assumption)."""


MARKET_VARIANTS: tuple[str, ...] = (
    "gpt-oss-120b@legal",
    "qwen3-coder-480b-a35b-fp8@acme",
    "glm-4.5-air-fp8@support",
    "gpt-oss-120b@sql",
    "qwen3-235b-a22b-instruct-2507-fp8@finance",
    "llama-4-scout-bf16@vision",
    "glm-4.6-fp8@agent",
    "minimax-m2@research",
    "gpt-oss-120b@edu",
)
"""Nine fine-tunes (catalog variants, core/catalog.py): each a model of its own with its base's
spec. Which bases and names is an assumption: fine-tunes of the open models tenants adapt."""

MARKET_MODELS: tuple[str, ...] = FLEET_MODELS + MARKET_VARIANTS
"""24 listed models in rank order: the fleet's fifteen (its order), then the nine fine-tunes
(an assumption: a fine-tune draws less than its base's own listing)."""

MARKET_DURATION_S = 3600.0
MARKET_SESSIONS_PER_S = 1.0 / 6.0
"""600 sessions an hour on average, all models together (the fleet preset's 40 a minute is 4×
as many over a quarter of the time): an assumption sized to replay in minutes."""

MARKET = MarketSpec(
    MARKET_MODELS, sessions_per_s=MARKET_SESSIONS_PER_S, duration_s=MARKET_DURATION_S
)
"""The market (sim/market.py's defaults: AI Ping's head of five, a Zipf(1) tail, ServeGen's
CVs, Prism's ×0.2–×5 windows of 600 s, one day over the hour, two bursty groups)."""

MARKET_BODY = replace(
    PAPER_WORKLOAD, sessions=round(MARKET_SESSIONS_PER_S * MARKET_DURATION_S),
    models=MARKET_MODELS, total_calls=None,
)  # fmt: skip
"""What each market session's calls are drawn from: the paper's fitted agent sessions
(docs/sources.md §2), about 32 calls each."""


BULK = TenantLoad(
    "bulk",
    replace(PAPER_WORKLOAD, sessions=120, total_calls=120 * 32, mean_interarrival_s=2.5),
)
"""A bulk tenant: 120 paper-like sessions in about the first 300 s (every 2.5 s on average:
4× the paper preset's rate, so it alone saturates the node)."""
IDE = TenantLoad(
    "ide",
    replace(PAPER_WORKLOAD, sessions=10, total_calls=10 * 32, mean_interarrival_s=30.0),
    priority=Priority.INTERACTIVE,
    start_s=150.0,
)
"""An IDE tenant: 10 interactive sessions starting between about 150 s and 450 s, while the
bulk tenant's backlog peaks."""
SATURATED_WORKLOAD = replace(
    PAPER_WORKLOAD, sessions=120, total_calls=None, mean_interarrival_s=2.5, calls_median=16.0,
    calls_sigma=1.0,
)  # fmt: skip
"""One tenant at 4× the paper preset's rate, its sessions short and long: calls per session
lognormal with median 16 and σ 1.0 (about a quarter under 8 calls, a tenth over 60)."""

PRESETS: dict[str, Preset] = {
    "paper": Preset(
        "paper",
        "the paper's setup: one 8×H200 node, three 100B+ models whose weights do not all fit "
        "(GLM-4.5-FP8, Qwen3-235B-A22B-BF16, Qwen3-Coder-480B-FP8), 30 sessions, 960 calls, "
        "Poisson arrivals every 10 s on average, Zipf(1) model popularity",
        PAPER_WORKLOAD,
    ),
    "small": Preset(
        "small",
        "a quick check: the paper's three models, 6 sessions of ~8 calls",
        replace(PAPER_WORKLOAD, sessions=6, total_calls=48),
    ),
    "cluster": Preset(
        "cluster",
        "a routed cluster: four 8×H200 nodes, six shipped models (three per node, each on two "
        "nodes), 120 sessions of 32 calls on average, Poisson arrivals every 3 s, Zipf(1) "
        "model popularity; a router picks the node of every call",
        CLUSTER_WORKLOAD,
        node_models=CLUSTER_NODE_MODELS,
        policies=CLUSTER_POLICIES,
    ),
    "subagents": Preset(
        "subagents",
        "the cluster preset where a third of the sessions spawn a sub-agent that shares their "
        "system prompt and tools (sim/subagents.py): does routing a child by its parent's KV "
        "save its prefix?",
        CLUSTER_WORKLOAD,
        node_models=CLUSTER_NODE_MODELS,
        policies=("round", "talaria", "talaria-no-parent"),
        subagents=SubagentSpec(),
    ),
    "fleet": Preset(
        "fleet",
        "a serverless fleet: fifteen 100B+ models with Zipf popularity whose shares rotate "
        "over a compressed day and burst, 600 sessions; the models packed onto 8 nodes "
        "(--nodes) by the sessions' demand, a router picks the node of every call, and the "
        "'placement' policy moves models between the nodes by the demand it measures",
        FLEET_WORKLOAD,
        policies=("round", "talaria", "placement", *CLUSTER_POLICIES[2:]),
        packed_nodes=8,
    ),
    "noisy": Preset(
        "noisy",
        "noisy neighbours on the paper's node: a bulk tenant's 120 sessions in ~300 s (it "
        "alone saturates the node) beside an IDE tenant's 10 interactive sessions starting "
        "between 150 s and 450 s",
        union_workload((BULK, IDE)),
        policies=("round", "-fair_queue", "talaria"),
        tenants=(BULK, IDE),
    ),
    "saturated": Preset(
        "saturated",
        "one tenant saturating the paper's node: 120 sessions, short and long (calls "
        "lognormal, median 16, σ 1), arriving every 2.5 s",
        SATURATED_WORKLOAD,
        policies=("round", "-fair_queue", "talaria"),
    ),
    "market": Preset(
        "market",
        "a long-tailed market: 24 listed 100B+ models (fifteen bases, nine fine-tunes) of "
        "which five take 87% of the sessions (AI Ping's shares) and the other 19 share the "
        "rest by Zipf(1); bursty Gamma arrivals per model, rates redrawn every 600 s, ~600 "
        "sessions an hour; packed onto 8 nodes (--nodes) by demand",
        MARKET_BODY,
        policies=("round", "talaria", "placement"),
        packed_nodes=8,
        market=MARKET,
    ),
    "market-aegaeon": Preset(
        "market-aegaeon",
        "the market where 3 models carry 98.65% of the sessions and 21 share 1.35% "
        "(Aegaeon's Model Studio: 94.1% of models receive 1.35% of requests)",
        MARKET_BODY,
        policies=("round", "talaria", "placement"),
        packed_nodes=8,
        market=replace(MARKET, head=aegaeon_head()),
    ),
}


def get_preset(name: str) -> Preset:
    """The preset named ``name``; ValueError listing the choices."""
    try:
        return PRESETS[name]
    except KeyError as exc:
        raise ValueError(f"unknown preset {name!r}; choose from: {', '.join(PRESETS)}") from exc
