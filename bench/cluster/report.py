"""The report of bench/cluster_live.py: the runs' table, R replicas against one (the scale-out
targets of issue 27) over the medians of the repeats, the simulator's prediction for the same
sessions, and the checkout's commit."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path
from typing import Any

from talaria.core.catalog import Catalog
from talaria.core.trace import SessionTrace
from talaria.sim.experiment import ExperimentSetup, run_experiment
from talaria.sim.metrics import percentile

SCT_TARGET = 0.05  # p50 SCT of R replicas within 5 % of one replica's
CPU_TARGET = 1.2  # proxy CPU per call within 1.2× of one replica's (issue 27; was 1.5×)


def table(runs: list[dict[str, Any]], predicted: dict[str, Any] | None) -> str:
    head = (
        "| replicas | sessions | calls | failures | forwarded | p50 SCT s | p95 SCT s "
        "| p50 call time s | wall s | proxy CPU ms/call | of which idle | runtimes CPU s "
        "| PG CPU s | driver CPU s | other CPU s | machine busy |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in runs:
        lines.append(
            f"| {r['replicas']} | {r['sessions']} | {r['calls']:,} | {r['failures']} "
            f"| {r['forwarded_calls']:,} | {r['p50_sct_s']:,.1f} | {r['p95_sct_s']:,.1f} "
            f"| {r['p50_call_time_s']:,.1f} | {r['wall_s']:.1f} "
            f"| {r['proxy_cpu_ms_per_call']:.2f} | {r['idle_proxy_cpu_ms_per_call']:.2f} "
            f"| {r['runtime_cpu_s']:.1f} "
            f"| {r['postgres_cpu_s']:.1f} | {r['driver_cpu_s']:.1f} "
            f"| {r['other_cpu_s']:.1f} | {r['machine_busy']:.0%} |"
        )
    if predicted is not None:
        lines.append(
            f"| simulator (talaria) | {predicted['sessions']} | {predicted['calls']:,} | | "
            f"| {predicted['p50_sct_s']:,.1f} | {predicted['p95_sct_s']:,.1f} | | | | | | | | | |"
        )
    return "\n".join(lines)


def ratios(one: dict[str, Any], many: dict[str, Any]) -> dict[str, Any]:
    sct = many["p50_sct_s"] / one["p50_sct_s"]
    cpu = many["proxy_cpu_ms_per_call"] / one["proxy_cpu_ms_per_call"]
    paired = [many["sct_s"][k] / v for k, v in one["sct_s"].items() if k in many["sct_s"]]
    # CPU per call less the idle replicas' share (heartbeats, sweeps), and what is left over
    # one replica's per forwarded call: the forwarding replica's work
    busy_one = one["proxy_cpu_ms_per_call"] - one["idle_proxy_cpu_ms_per_call"]
    busy_many = many["proxy_cpu_ms_per_call"] - many["idle_proxy_cpu_ms_per_call"]
    share = many["forwarded_calls"] / many["calls"]
    return {
        "p50_sct_ratio": sct,
        "p50_sct_met": abs(sct - 1) <= SCT_TARGET,
        "p95_sct_ratio": many["p95_sct_s"] / one["p95_sct_s"],
        "median_session_sct_ratio": percentile(paired, 50),
        "p50_call_time_ratio": many["p50_call_time_s"] / one["p50_call_time_s"],
        "proxy_cpu_per_call_ratio": cpu,
        "proxy_cpu_met": cpu <= CPU_TARGET,
        "busy_proxy_cpu_ms_per_call": [busy_one, busy_many],
        "forwarded_share": share,
        "forwarding_cpu_ms_per_forwarded_call": (busy_many - busy_one) / share
        if share
        else math.nan,
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median over ``runs`` (one replica count) of every figure the ratios use."""
    if len(runs) == 1:
        return runs[0]
    keys = (
        "p50_sct_s",
        "p95_sct_s",
        "p50_call_time_s",
        "proxy_cpu_ms_per_call",
        "idle_proxy_cpu_ms_per_call",
        "forwarded_calls",
        "calls",
    )
    out: dict[str, Any] = {k: percentile([r[k] for r in runs], 50) for k in keys}
    out["sct_s"] = {
        k: percentile([r["sct_s"][k] for r in runs if k in r["sct_s"]], 50)
        for k in runs[0]["sct_s"]
    }
    return out


def predict(
    sessions: list[SessionTrace], catalog: Catalog, setup: ExperimentSetup
) -> dict[str, Any]:
    """The simulator's replay of the same sessions, policy talaria (about a second)."""
    doc = run_experiment(sessions, catalog, setup, ["talaria"], include_dedicated=False)
    talaria = doc["policies"]["talaria"]
    return {
        "sessions": doc["sessions"],
        "calls": doc["calls"],
        "p50_sct_s": talaria["p50_sct_s"],
        "p95_sct_s": talaria["p95_sct_s"],
        "mean_sct_s": talaria["mean_sct_s"],
    }


def commit() -> str:
    """The checkout's commit, with ``+dirty`` when tracked files differ from it."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "diff", "--quiet", "HEAD"], check=False
        ).returncode
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")
