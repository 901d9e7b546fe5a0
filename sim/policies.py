"""Named replay policies: each is a (router, scheduler flags) pair — the one place they are
mapped.

| name | router | flags | isolates |
|---|---|---|---|
| ``round`` | ``load-only`` | all off | the per-request baseline |
| ``talaria`` | ``talaria`` | all on | the whole system, on the preset's fixed layout |
| ``talaria-learned`` | ``talaria`` | ``talaria`` + ``learned_gaps`` | learned tool gaps |
| ``talaria-no-parent`` | ``talaria``, ``parent_kv`` 0 | all on | sub-agents near their parent |
| ``placement`` | ``talaria`` | all on | ``talaria`` with the placement controller moving models |
| ``serverless`` | ``load-only`` | ``serverless_instances`` | request-level instances |
| ``load-only``, ``sticky``, ``kv-aware`` | that router | all on | the router |
| ``+<flag>`` | ``talaria`` | one flag over ``round`` | one scheduler flag |
| ``-<flag>`` | ``talaria`` | ``talaria`` with one flag off | what one flag adds to the rest |

``serverless`` is what a serverless platform does (ServerlessLLM's model, a fixed
keep-alive): no session awareness. ``round`` is what a per-request stack does: least
outstanding work per call, and a round scheduler on each node. The other routers run with
``talaria``'s node flags, so they differ from it only in routing. ``+<flag>`` names are the
single-node ablations.

On one node (or when only one node hosts a model) every router sends every call to the only
candidate, so the single-node results depend on the flags alone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from talaria.core.routing.routers import ROUTER_NAMES
from talaria.core.routing.settings import RoutingConfig, ScorerWeights
from talaria.runtime.scheduling.flags import (
    DEFAULT_POLICIES,
    FLAG_NAMES,
    ROUND,
    SERVERLESS,
    TALARIA,
    TALARIA_LEARNED,
    SchedulerFlags,
    policy_flags,
)

CLUSTER_POLICIES: tuple[str, ...] = ("round", "talaria", "load-only", "sticky", "kv-aware")
"""Default policies of multi-node presets: the baseline, the system, and each other router
with the system's node flags."""
SINGLE_NODE_POLICIES: tuple[str, ...] = DEFAULT_POLICIES


@dataclass(frozen=True)
class Policy:
    """A named replay policy: the router of the cluster and the nodes' scheduler flags."""

    name: str
    router: str
    flags: SchedulerFlags
    placement: bool = False
    """A placement controller moves models between the nodes (core/placement/)."""
    unweighted: tuple[str, ...] = ()
    """Scorers the router counts with weight 0 (reported, not counted)."""

    def routing(self, config: RoutingConfig) -> RoutingConfig:
        """``config`` with the router's ``unweighted`` scorers at weight 0."""
        if not self.unweighted:
            return config
        table = config.weights(self.router)
        zeroed = ScorerWeights({k: 0.0 if k in self.unweighted else v for k, v in table.items()})
        return replace(config, **{self.router.replace("-", "_"): zeroed})  # type: ignore[arg-type]


def resolve_policy(name: str) -> Policy:
    """The (router, flags) of policy ``name`` (table above); ValueError lists the choices."""
    if name == "round":
        return Policy(name, "load-only", ROUND)
    if name == "talaria":
        return Policy(name, "talaria", TALARIA)
    if name == "talaria-learned":
        return Policy(name, "talaria", TALARIA_LEARNED)
    if name == "talaria-no-parent":
        return Policy(name, "talaria", TALARIA, unweighted=("parent_kv",))
    if name == "placement":
        return Policy(name, "talaria", TALARIA, placement=True)
    if name == "serverless":
        return Policy(name, "load-only", SERVERLESS)
    if name in ROUTER_NAMES:
        return Policy(name, name, TALARIA)
    try:
        return Policy(name, "talaria", policy_flags(name))
    except ValueError:
        flags = [*(f"+{f}" for f in FLAG_NAMES), *(f"-{f}" for f in FLAG_NAMES)]
        names = ["round", "talaria", "talaria-learned", "talaria-no-parent", "placement"]
        names += ["serverless"]
        names += [*ROUTER_NAMES, *flags]
        choices = ", ".join(dict.fromkeys(names))
        raise ValueError(
            f"unknown policy {name!r}; choose from: {choices} (several flags: +a+b, -a-b)"
        ) from None
