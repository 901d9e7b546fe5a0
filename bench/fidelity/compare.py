"""The comparison of bench/fidelity/run.py: the live trace replayed by the simulator (with the
calibrated profile, the default one, and at the recorded arrival times) and set against what was
measured, the repeats against each other, and the printed table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from live import repeat_dir
from serving import MODELS

from talaria.core.catalog import load_catalog
from talaria.core.trace import SessionTrace, read_trace
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import policy_flags
from talaria.runtime.sim_node import NodeSetup
from talaria.sim.fidelity import compare, repeatability
from talaria.sim.replay import Transport, replay


def repeats_doc(
    lives: list[list[SessionTrace]], profile: Path, policy: str, quantum_s: float
) -> dict[str, Any]:
    """Several live runs of one workload: how well they predict each other (``repeatability``,
    the floor under the simulator's error here) and the simulator's figures against each."""
    return {
        "runs": len(lives),
        "live_vs_live": repeatability(lives),
        "predicted_vs_live": [
            replay_and_compare(live, profile, policy, quantum_s)["figures"] for live in lives
        ],
    }


def replay_and_compare(
    live: list[SessionTrace], profile: Path, policy: str, quantum_s: float
) -> dict[str, Any]:
    """The live trace replayed closed-loop with the calibrated profile (the comparison), with
    the default profile (``uncalibrated_figures``), and with the calibrated profile at the
    recorded arrival times (``recorded_arrivals_figures``: the node model alone)."""
    catalog = load_catalog([profile])
    flags = policy_flags(policy)
    config = SchedulerConfig(quantum_s=quantum_s)
    transport = Transport.of(catalog.profile("calibrated"))

    def outcome(name: str, recorded: bool) -> dict[str, Any]:
        layout = [("node0", NodeSetup("cpu-vllm", name, MODELS))]
        result = replay(live, catalog, layout, flags, config, router="talaria",
                        transport=transport, recorded_arrivals=recorded)  # fmt: skip
        return compare(live, result)

    doc = outcome("calibrated", False)
    doc["uncalibrated_figures"] = outcome("default", False)["figures"]
    recorded = outcome("calibrated", True)
    doc["recorded_arrivals_figures"] = recorded["figures"]
    doc["recorded_arrivals_calls"] = recorded["calls"]
    return doc


def replay_only(out: Path, policy: str, quantum_s: float) -> dict[str, Any]:
    """Redo step 6 on a finished run's directory (its live.jsonl and profile.toml), keeping its
    run record: to compare a changed simulator against the same live run."""
    old = json.loads((out / "fidelity.json").read_text())
    profile = out / "profile.toml"
    doc = replay_and_compare(read_trace(out / "live.jsonl"), profile, policy, quantum_s)
    repeats = int(old["run"].get("repeats", 1))
    if repeats > 1:
        lives = [read_trace(repeat_dir(out, r) / "live.jsonl") for r in range(repeats)]
        doc["repeats"] = repeats_doc(lives, profile, policy, quantum_s)
    doc["run"] = old["run"]
    return doc


def report(doc: dict[str, Any]) -> str:
    f, u = doc["figures"], doc["uncalibrated_figures"]
    rows = [
        ("p50 SCT: measured / predicted (s)", f"{f['measured_p50_sct_s']:.2f} / "
         f"{f['predicted_p50_sct_s']:.2f}", f"{u['predicted_p50_sct_s']:.2f}"),
        ("p95 SCT: measured / predicted (s)", f"{f['measured_p95_sct_s']:.2f} / "
         f"{f['predicted_p95_sct_s']:.2f}", f"{u['predicted_p95_sct_s']:.2f}"),
        ("p50 SCT relative error", f"{f['p50_sct_rel_error']:.1%}",
         f"{u['p50_sct_rel_error']:.1%}"),
        ("p95 SCT relative error", f"{f['p95_sct_rel_error']:.1%}",
         f"{u['p95_sct_rel_error']:.1%}"),
        ("per-session SCT |error|: median / p95", f"{f['sct_median_rel_error']:.1%} / "
         f"{f['sct_p95_rel_error']:.1%}", f"{u['sct_median_rel_error']:.1%} / "
         f"{u['sct_p95_rel_error']:.1%}"),
        ("per-call latency |error|: median / p95", f"{f['call_latency_median_rel_error']:.1%} / "
         f"{f['call_latency_p95_rel_error']:.1%}", f"{u['call_latency_median_rel_error']:.1%} / "
         f"{u['call_latency_p95_rel_error']:.1%}"),
        ("per-call latency error, signed median",
         f"{f['call_latency_median_signed_rel_error']:+.1%}",
         f"{u['call_latency_median_signed_rel_error']:+.1%}"),
        ("per-call TTFT |error|: median / p95", f"{f['ttft_median_rel_error']:.1%} / "
         f"{f['ttft_p95_rel_error']:.1%}", f"{u['ttft_median_rel_error']:.1%} / "
         f"{u['ttft_p95_rel_error']:.1%}"),
        ("tool time / SCT (measured)", f"{f['tool_time_fraction']:.1%}", ""),
    ]  # fmt: skip
    r = doc.get("recorded_arrivals_figures")
    if r is not None:
        rows += [
            ("at recorded arrivals: per-call latency |error| median / p95",
             f"{r['call_latency_median_rel_error']:.1%} / {r['call_latency_p95_rel_error']:.1%}",
             ""),
            ("at recorded arrivals: per-call TTFT |error| median / p95",
             f"{r['ttft_median_rel_error']:.1%} / {r['ttft_p95_rel_error']:.1%}", ""),
        ]  # fmt: skip
    width = max(len(r[0]) for r in rows)
    lines = [f"{'':{width}}  {'calibrated':>22}  {'uncalibrated':>22}"]
    lines += [f"{a:{width}}  {b:>22}  {c:>22}" for a, b, c in rows]
    if "repeats" in doc:
        lines += ["", repeats_report(doc["repeats"])]
    return "\n".join(lines)


REPEAT_COLUMNS = (
    ("p50 SCT", "p50_sct_rel_error"),
    ("p95 SCT", "p95_sct_rel_error"),
    ("call latency |err| median", "call_latency_median_rel_error"),
    ("TTFT |err| median", "ttft_median_rel_error"),
)


def repeats_report(repeats: dict[str, Any]) -> str:
    """Per live run: the other runs' median as its prediction, then the simulator's."""
    head = "| live run | predicted by | " + " | ".join(c for c, _ in REPEAT_COLUMNS) + " |"
    lines = [head, "|" + "---|" * (2 + len(REPEAT_COLUMNS))]
    pairs = zip(repeats["live_vs_live"], repeats["predicted_vs_live"], strict=True)
    for r, (peers, sim) in enumerate(pairs):
        for label, f in (("the other runs", peers), ("the simulator", sim)):
            cells = " | ".join(f"{f[k]:.1%}" for _, k in REPEAT_COLUMNS)
            lines.append(f"| {r} | {label} | {cells} |")
    return "\n".join(lines)
