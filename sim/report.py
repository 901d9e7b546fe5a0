"""Console tables of a replay experiment (SCT per policy; for routed multi-node runs, the
routing-reason mix) and of a sweep (rich)."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def _f(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


REASON_ORDER: tuple[str, ...] = (
    "reserved",
    "sticky",
    "kv-hbm",
    "kv-host",
    "model-active",
    "model-staged",
    "model-host",
    "least-loaded",
    "model-affinity",
    "tie-break",
    "only-candidate",
)
"""Columns of the routing-reason table, rule-based reasons first (talaria.core.routing)."""


def _nodes(doc: dict[str, Any]) -> int:
    setup = doc["setup"]
    node_models = setup.get("node_models")
    return len(node_models) if node_models else int(setup.get("nodes", 1))


def experiment_table(doc: dict[str, Any]) -> Table:
    """Per policy (then the dedicated reference and the oracle bound): SCT percentiles and
    mean (s), speedups over ``round``, the ratio to the oracle, switches, KV and GPU counters."""
    nodes = _nodes(doc)
    where = f", {nodes} nodes" if nodes > 1 else ""
    table = Table(
        title=f"SCT per policy — {doc['sessions']} sessions, {doc['calls']} calls "
        f"(quantum {doc['setup']['quantum_s']:g} s{where})"
    )
    for name in (
        "policy",
        "p50 SCT s",
        "p95 SCT s",
        "mean SCT s",
        "speedup p50",
        "speedup p95",
        "÷oracle p50",
        "switches",
        "switch s",
        "recomputed tok",
        "restored GB",
        "GPU busy",
        "SP admits",
        "calls",
    ):
        table.add_column(name, justify="left" if name == "policy" else "right")
    rows = [*doc["policies"].items()]
    if "dedicated" in doc:
        rows.append(("dedicated (ref)", doc["dedicated"]))
    for name, s in rows:
        table.add_row(
            name,
            _f(s["p50_sct_s"]),
            _f(s["p95_sct_s"]),
            _f(s["mean_sct_s"]),
            _f(s.get("speedup_p50"), 2),
            _f(s.get("speedup_p95"), 2),
            _f(s.get("oracle_ratio_p50"), 2),
            str(s["switches"]),
            _f(s["switch_s_total"]),
            f"{s['recomputed_tokens']:,}",
            _f(s["restored_bytes"] / 1e9),
            f"{s['gpu_busy_fraction']:.0%}",
            str(s["sp_admitted"]),
            str(s["calls_completed"]),
        )
    oracle = doc["oracle"]
    table.add_row(
        "oracle (bound)",
        _f(oracle["p50_sct_s"]),
        _f(oracle["p95_sct_s"]),
        _f(oracle["mean_sct_s"]),
        *["–"] * 9,
        str(oracle["calls_completed"]),
    )
    return table


def routing_table(doc: dict[str, Any]) -> Table | None:
    """Per policy: its router, the share of calls per routing reason, and the migrations
    (continuations sent to another node than the session's previous call). None when every
    call had a single candidate node (one node, or dedicated), where routing decides nothing."""
    policies: dict[str, dict[str, Any]] = doc["policies"]
    mixes = {name: s.get("routing_reasons", {}) for name, s in policies.items()}
    seen = {reason for mix in mixes.values() for reason in mix}
    if not seen - {"only-candidate"}:
        return None
    reasons = [r for r in REASON_ORDER if r in seen] + sorted(seen - set(REASON_ORDER))
    table = Table(title="Routing-reason mix — share of calls per reason (calls)")
    for name in ("policy", "router", *reasons, "migrations"):
        table.add_column(name, justify="left" if name in ("policy", "router") else "right")
    for name, summary in policies.items():
        mix = mixes[name]
        total = sum(mix.values()) or 1
        cells = [f"{mix[r] / total:.0%} ({mix[r]:,})" if mix.get(r) else "–" for r in reasons]
        table.add_row(
            name, str(summary.get("router", "–")), *cells, f"{summary.get('migrations', 0):,}"
        )
    return table


def sweep_table(rows: list[dict[str, Any]]) -> Table:
    """One row per swept (param, value): round's and talaria's SCT p50/p95 (s), the speedups,
    talaria ÷ dedicated and ÷ oracle at p50, each the median over the seeds."""
    seeds = rows[0].get("seeds", 1) if rows else 1
    table = Table(
        title=f"Sensitivity: round vs talaria, median over {seeds} seed(s) "
        "(dedicated = one node per model)"
    )
    for name in (
        "param",
        "value",
        "round p50",
        "round p95",
        "talaria p50",
        "talaria p95",
        "speedup p50",
        "speedup p95",
        "talaria÷dedicated p50",
        "÷oracle p50",
    ):
        table.add_column(name, justify="left" if name == "param" else "right")
    for r in rows:
        table.add_row(
            r["param"],
            f"{r['value']:g}",
            _f(r["round_p50_sct_s"]),
            _f(r["round_p95_sct_s"]),
            _f(r["talaria_p50_sct_s"]),
            _f(r["talaria_p95_sct_s"]),
            _f(r["speedup_p50"], 2),
            _f(r["speedup_p95"], 2),
            _f(r["multiplexing_cost_p50"], 2),
            _f(r["oracle_ratio_p50"], 2),
        )
    return table
