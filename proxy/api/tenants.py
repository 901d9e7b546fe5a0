"""Each tenant's share of the nodes now (``GET /admin/tenants``): the runtimes' per-tenant
accounts (``core.status.TenantShare``, keyed by the tenant's digest: the runtime never learns
tenant ids) summed over the instances and named again with the store's tenants.

    share_t = served_t / Σ_u served_u

``served``: the service seconds (admission to finish, measured on the engines) the tenant's calls
have had on the instances since they started; ``waiting`` / ``running``: its calls now;
``oldest_wait_s``: the longest any of its waiting calls has waited, over the instances."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from talaria.core.status import InstanceStatus
from talaria.proxy.callpath.runner import tenant_digest


def tenant_shares(
    statuses: Mapping[str, InstanceStatus], names: Mapping[str, str]
) -> list[dict[str, Any]]:
    """One row per tenant seen on ``statuses`` (instance → status), most served first;
    ``names``: tenant id → name (a digest no known tenant has is shown as itself)."""
    by_digest = {tenant_digest(tenant_id): name for tenant_id, name in names.items()}
    rows: dict[str, dict[str, Any]] = {}
    for instance, status in statuses.items():
        for digest, part in status.tenants.items():
            row = rows.setdefault(
                digest,
                {
                    "tenant": by_digest.get(digest, digest),
                    "known": digest in by_digest,
                    "served_s": 0.0,
                    "waiting_calls": 0,
                    "running_calls": 0,
                    "oldest_wait_s": 0.0,
                    "instances": {},
                },
            )
            row["served_s"] += part.served_s
            row["waiting_calls"] += part.waiting_calls
            row["running_calls"] += part.running_calls
            row["oldest_wait_s"] = max(row["oldest_wait_s"], part.oldest_wait_s)
            row["instances"][instance] = {
                "served_s": part.served_s,
                "waiting_calls": part.waiting_calls,
                "running_calls": part.running_calls,
                "oldest_wait_s": part.oldest_wait_s,
            }
    total = sum(r["served_s"] for r in rows.values())
    for row in rows.values():
        row["share"] = row["served_s"] / total if total > 0 else 0.0
    return sorted(rows.values(), key=lambda r: (-r["served_s"], r["tenant"]))
