"""Named replay policies: each is a (router, scheduler flags) pair — the one place they are
mapped.

| name | router | flags | isolates |
|---|---|---|---|
| ``round`` | ``load-only`` | all off | the per-request baseline |
| ``talaria`` | ``talaria`` | all on | the whole system, on the preset's fixed layout |
| ``talaria-learned`` | ``talaria`` | ``talaria`` + ``learned_gaps`` | learned tool gaps |
| ``placement`` | ``talaria`` | all on | ``talaria`` with the placement controller moving models |
| ``load-only``, ``sticky``, ``kv-aware`` | that router | all on | the router |
| ``+<flag>`` | ``talaria`` | one flag over ``round`` | one scheduler flag |
| ``-<flag>`` | ``talaria`` | ``talaria`` with one flag off | what one flag adds to the rest |

``round`` is what a per-request stack does: least outstanding work per call, and a round
scheduler on each node. The other routers run with ``talaria``'s node flags, so they differ
from it only in routing. ``+<flag>`` names are the single-node ablations.

On one node (or when only one node hosts a model) every router sends every call to the only
candidate, so the single-node results depend on the flags alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from talaria.core.routing.routers import ROUTER_NAMES
from talaria.runtime.scheduling.flags import (
    DEFAULT_POLICIES,
    FLAG_NAMES,
    ROUND,
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


def resolve_policy(name: str) -> Policy:
    """The (router, flags) of policy ``name`` (table above); ValueError lists the choices."""
    if name == "round":
        return Policy(name, "load-only", ROUND)
    if name == "talaria":
        return Policy(name, "talaria", TALARIA)
    if name == "talaria-learned":
        return Policy(name, "talaria", TALARIA_LEARNED)
    if name == "placement":
        return Policy(name, "talaria", TALARIA, placement=True)
    if name in ROUTER_NAMES:
        return Policy(name, name, TALARIA)
    try:
        return Policy(name, "talaria", policy_flags(name))
    except ValueError:
        flags = [*(f"+{f}" for f in FLAG_NAMES), *(f"-{f}" for f in FLAG_NAMES)]
        names = ["round", "talaria", "talaria-learned", "placement", *ROUTER_NAMES, *flags]
        choices = ", ".join(dict.fromkeys(names))
        raise ValueError(
            f"unknown policy {name!r}; choose from: {choices} (several flags: +a+b, -a-b)"
        ) from None
