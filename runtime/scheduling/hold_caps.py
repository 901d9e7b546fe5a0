"""What one tenant's holds may keep when another tenant's call needs the memory
(issue 46: 80 sessions hinting a day's tool gap held 99.5 % of a node's KV, and another
tenant's new session waited until they idled out). Pure: every input is an argument.

A hold (holds.py) pins its session's KV in HBM and keeps a budget for its next call;
nothing else may evict it. Those are claims a client makes (a gap hint) or the node guesses
(the mean gap), so they hold only while no *other* tenant needs the room. When a call of
tenant ``a`` does not fit in memory, the holds of every other tenant yield, in this order, one
at a time until it fits:

1. **Past their tenant's share.** Tenant ``t`` may keep ``cap_t = w_t / Σ_u w_u × R`` bytes of
   holds, ``R`` the node's KV room (HBM less the resident weights), ``w`` the tenants' weights
   (their API keys', ``CallRequest.tenant_weight``) over the tenants with live sessions on the
   node (a call waiting or running, or in a tool gap), ``a`` included. Its holds count in the
   order they are expected back (soonest first: the most likely to be used); those past
   ``cap_t`` yield, the latest expected first. The weight share, not a fixed fraction: it is
   the share the fair queue already gives each tenant of the node's service (fairness.py), a
   lone tenant keeps everything (no room is left idle for tenants that are not there), and it
   adapts as tenants come and go; a fixed fraction would either strand memory when one tenant
   is alone or let each of many tenants hold more than the node has.
2. **Stale.** A hold older than ``stale_gaps`` × its session's mean tool gap (the mean rule's
   estimate, core/gap_model.py ``MeanGaps``: the population prior, 3.2 s of docs/
   sources.md §2, blended with the gaps the session actually took here; a hint does not enter
   it), oldest first. ``stale_gaps`` = 4: past the 0.95 quantile of the prior's log-normal
   gap, e^(1.645 σ − σ²/2) = 3.85 mean gaps for σ = 1.5589 (core/gaps.py), so a hold the
   learned rule would still keep 95 % of the time is not yet stale.

A tenant's own holds never yield to its own calls (as before). A small continuation renews a
session's hold, but not past these bounds: the share is taken over all of the tenant's holds
at the moment of need, and the mean gap grows only with gaps the session really waited.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from talaria.core.holds import ReleaseReason

STALE_HOLD_GAPS = 4.0
"""A hold past this many mean gaps of its session is stale (module docstring, rule 2)."""


@dataclass(frozen=True)
class HeldKv:
    """One hold as the caps read it: its session and tenant, the HBM it keeps
    (its pinned KV plus the budget it holds for the next call, bytes), when it was taken and
    when its session is expected back (clock seconds), and its session's mean tool gap."""

    session_key: str
    tenant: str
    held_bytes: float
    created_s: float
    expected_return_s: float
    mean_gap_s: float


def tenant_caps_bytes(weights: Mapping[str, float], room_bytes: float) -> dict[str, float]:
    """Each live tenant's cap: ``w_t / Σ w × room_bytes`` (nothing when no tenant is live)."""
    total = sum(weights.values())
    if total <= 0:
        return {}
    return {tenant: weight / total * room_bytes for tenant, weight in weights.items()}


def over_share(
    holds: Sequence[HeldKv], weights: Mapping[str, float], room_bytes: float
) -> list[HeldKv]:
    """The holds past their tenant's cap (rule 1): each tenant's holds summed soonest back
    first, those from the first one that passes the cap on (a tenant not in ``weights`` has no
    live session: every one of its holds is past its cap)."""
    caps = tenant_caps_bytes(weights, room_bytes)
    used: dict[str, float] = {}
    past = []
    for hold in sorted(holds, key=lambda h: (h.expected_return_s, h.session_key)):
        used[hold.tenant] = used.get(hold.tenant, 0.0) + hold.held_bytes
        if used[hold.tenant] > caps.get(hold.tenant, 0.0):
            past.append(hold)
    return past


def is_stale(hold: HeldKv, now_s: float, stale_gaps: float = STALE_HOLD_GAPS) -> bool:
    """Whether ``hold`` has lasted past ``stale_gaps`` mean gaps of its session (rule 2)."""
    return now_s - hold.created_s > stale_gaps * hold.mean_gap_s


def yielding(
    holds: Sequence[HeldKv],
    tenant: str,
    weights: Mapping[str, float],
    room_bytes: float,
    now_s: float,
    stale_gaps: float = STALE_HOLD_GAPS,
) -> list[tuple[str, ReleaseReason]]:
    """The holds that yield to a call of ``tenant`` that does not fit, in the order they are
    released, each with why: other tenants' holds past their share (the latest expected back
    first), then their stale ones (the oldest first). ``weights``: the live tenants' weights,
    ``tenant``'s among them."""
    others = [h for h in holds if h.tenant != tenant]
    past = over_share(holds, weights, room_bytes)
    order = [
        (h.session_key, ReleaseReason.OVER_SHARE)
        for h in sorted(past, key=lambda h: (-h.expected_return_s, h.session_key))
        if h.tenant != tenant
    ]
    gone = {h.session_key for h in past}
    stale = [h for h in others if h.session_key not in gone and is_stale(h, now_s, stale_gaps)]
    order += [
        (h.session_key, ReleaseReason.STALE)
        for h in sorted(stale, key=lambda h: (h.created_s, h.session_key))
    ]
    return order
