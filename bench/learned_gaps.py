"""Tool gaps learned on the server (issue 41, item 3): ``talaria`` (mean gap, hold
max(2·gap, gap + 1 s)) against ``talaria-learned`` (log-normal gap per (tenant, model, agent
kind), the KV held to its q-quantile, core/gaps.py) on four workloads, over several workload
seeds.

    .venv/bin/python bench/learned_gaps.py [--seeds 3] [--first-seed 0]
        [--workloads paper,skewed,interactive,two-agents] [--quantiles 0.95[,0.9...]]
        [--json out/learned-gaps.json]

Workloads (all the paper preset's node, models and 960 calls over 30 sessions; only the tool
gaps change, docs/sources.md §2):

- ``paper``: the preset as it is: 96 % lognormal(0.4 s, σ 1.3) + 4 % lognormal(35 s, σ 1.0);
- ``skewed``: a heavier tail of long tools, ``gap_long_fraction`` 0.15 (e.g. an agent that runs
  the test suite every few steps): the case a mean-based hold gets wrong;
- ``interactive``: quick tools only, ``gap_long_fraction`` 0, ``gap_short_median_s`` 0.2;
- ``two-agents``: one tenant running two kinds of agent, half the sessions (15, 480 calls)
  ``skewed``'s (agent ``tester``), half ``interactive``'s (agent ``chat``), each half arriving
  at half the rate, so the mix arrives as the paper preset does (sim/tenants.py, drawn with
  seeds ``seed`` and ``seed + 1,000,003``). Besides the two policies it replays
  ``talaria-learned`` on the same sessions with their agent kind erased (``talaria-learned
  one-population``): one population per (tenant, model), what the node learned before the
  agent kind was on its wire.

Prints, per workload, seed and policy: p50/p95 SCT, reservations taken (released for any
reason), returned, expired, the expired share (expired ÷ (returned + expired)), the missed share
((expired + slot closed) ÷ (returned + expired + slot closed): released before their session
came back for either reason) and the memory they held, GB·s: the admission budget held for the
sessions' next calls, and the sessions' KV kept pinned (core/holds.py); then per
workload and policy the mean over seeds, and per seed against ``talaria`` on the same
sessions: the median and range of p50 ÷ talaria's p50, the seeds where it is not worse, and
the seeds where the expired share fell. ``--quantiles``: the hold's quantile q of
``talaria-learned`` (``SchedulerConfig.gap_quantile``; default 0.95); each further q replays
``talaria-learned`` once more; a q other than 0.95 is shown as ``talaria-learned q=…``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from talaria.core.catalog import load_catalog
from talaria.core.gaps import DEFAULT_QUANTILE
from talaria.core.trace import SessionTrace
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.sim.experiment import ExperimentSetup, run_experiment
from talaria.sim.presets import get_preset
from talaria.sim.tenants import TenantLoad, mixed_sessions
from talaria.sim.workload import WorkloadSpec, generate_sessions

POLICIES = ("talaria", "talaria-learned")
WORKLOADS: dict[str, dict[str, float]] = {
    "paper": {},
    "skewed": {"gap_long_fraction": 0.15},
    "interactive": {"gap_long_fraction": 0.0, "gap_short_median_s": 0.2},
    "two-agents": {},
}
AGENTS = (("tester", "skewed"), ("chat", "interactive"))
"""``two-agents``: each agent kind and the workload its half of the sessions is drawn from."""
POOLED = "talaria-learned one-population"
COLUMNS = (
    "p50 SCT", "p95 SCT", "taken", "returned", "expired", "exp share", "missed", "budget GB·s",
    "pinned GB·s",
)  # fmt: skip


def row(summary: dict[str, Any]) -> tuple[float, ...]:
    """The printed figures of one policy's summary (``COLUMNS``)."""
    released = summary["reservations"]
    share = summary["reservations_expired_share"]
    missed = released["expired"] + released["slot-closed"]
    settled = released["returned"] + missed
    return (
        summary["p50_sct_s"],
        summary["p95_sct_s"],
        float(sum(released.values())),
        float(released["returned"]),
        float(released["expired"]),
        float("nan") if share is None else share,
        missed / settled if settled else float("nan"),
        summary["reservation_gb_s"],
        summary["reservation_pinned_gb_s"],
    )


def fmt(values: tuple[float, ...]) -> str:
    """One table row's figures."""
    p50, p95, taken, returned, expired, share, missed, budget, pinned = values
    return (
        f"| {p50:.1f} | {p95:.1f} | {taken:.0f} | {returned:.0f} | {expired:.0f} "
        f"| {share:.3f} | {missed:.3f} | {budget:,.0f} | {pinned:,.0f} |"
    )


def paired(base: list[tuple[float, ...]], other: list[tuple[float, ...]]) -> str:
    """Per seed against ``talaria``'s rows ``base``: the median and range of the p50 ratio,
    the seeds where p50 is not worse, and the seeds where the expired share fell."""
    ratios = [o[0] / b[0] for b, o in zip(base, other, strict=True)]
    fell = sum(1 for b, o in zip(base, other, strict=True) if o[5] < b[5])
    n = len(ratios)
    return (
        f"| {statistics.median(ratios):.3f} ({min(ratios):.2f}–{max(ratios):.2f}) "
        f"| {sum(1 for r in ratios if r <= 1.0)}/{n} | {fell}/{n} |"
    )


def draw(
    name: str,
    base: WorkloadSpec,
    windows: dict[str, int],
    reasoning: dict[str, bool],
    seed: int,
) -> list[SessionTrace]:
    """The sessions of workload ``name`` (module docstring) for ``seed``."""
    if name != "two-agents":
        spec: WorkloadSpec = replace(base, **WORKLOADS[name])  # type: ignore[arg-type]
        return generate_sessions(spec, windows, reasoning, seed)
    halves = [
        TenantLoad(
            "default",
            replace(
                base,
                sessions=base.sessions // 2,
                total_calls=None if base.total_calls is None else base.total_calls // 2,
                mean_interarrival_s=2 * base.mean_interarrival_s,
                **WORKLOADS[kind],  # type: ignore[arg-type]
            ),
            agent=agent,
        )
        for agent, kind in AGENTS
    ]
    return mixed_sessions(halves, windows, reasoning, seed)


def pooled(sessions: list[SessionTrace]) -> list[SessionTrace]:
    """``sessions`` with their agent kind erased (one population per (tenant, model))."""
    return [
        replace(s, agent="", calls=tuple(replace(c, agent="") for c in s.calls)) for s in sessions
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=3, help="workload seeds (default 3)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"of {', '.join(WORKLOADS)}"
    )
    parser.add_argument(
        "--quantiles",
        default=str(DEFAULT_QUANTILE),
        help=f"hold quantiles of talaria-learned (default {DEFAULT_QUANTILE})",
    )
    parser.add_argument("--json", type=Path, default=None, help="write every summary here")
    args = parser.parse_args()
    quantiles = [float(q) for q in args.quantiles.split(",") if q]
    if not quantiles or not all(0.0 < q < 1.0 for q in quantiles):
        parser.error("--quantiles: one or more numbers in (0, 1)")
    names = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {', '.join(WORKLOADS)}")
    catalog = load_catalog()
    preset = get_preset("paper")
    models = [catalog.model(m) for m in preset.workload.models]
    windows = {m.name: m.context_window_tokens for m in models}
    reasoning = {m.name: m.reasoning for m in models}
    setup = ExperimentSetup(
        preset.server, preset.profile, preset.workload.models, quantum_s=preset.quantum_s
    )
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    rows: dict[tuple[str, str], list[tuple[float, ...]]] = {}
    out: dict[str, Any] = {}
    print("| workload | seed | policy | " + " | ".join(COLUMNS) + " |")
    print("|---|---|---|" + "---|" * len(COLUMNS), flush=True)
    for name in names:
        for seed in seeds:
            sessions = draw(name, preset.workload, windows, reasoning, seed)
            for i, q in enumerate(quantiles):
                config = SchedulerConfig(quantum_s=setup.quantum_s, gap_quantile=q)
                policies = POLICIES if i == 0 else POLICIES[1:]
                doc = run_experiment(
                    sessions, catalog, setup, policies, include_dedicated=False,
                    include_oracle=False, config=config,
                )  # fmt: skip
                summaries = [(p, doc["policies"][p]) for p in policies]
                if name == "two-agents":
                    one = run_experiment(
                        pooled(sessions), catalog, setup, ("talaria-learned",),
                        include_dedicated=False, include_oracle=False, config=config,
                    )  # fmt: skip
                    summaries.append((POOLED, one["policies"]["talaria-learned"]))
                for policy, summary in summaries:
                    plain = policy == "talaria" or q == DEFAULT_QUANTILE
                    label = policy if plain else f"{policy} q={q:g}"
                    values = row(summary)
                    rows.setdefault((name, label), []).append(values)
                    print(f"| {name} | {seed} | {label} " + fmt(values), flush=True)
                    out[f"{name}/{seed}/{label}"] = {
                        k: v for k, v in summary.items() if k not in ("sct_s", "timeline")
                    }
    print()
    print(f"Mean over seeds {seeds.start}–{seeds.stop - 1}:")
    print()
    print("| workload | policy | " + " | ".join(COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for (name, policy), per_seed in rows.items():
        means = tuple(statistics.fmean(column) for column in zip(*per_seed, strict=True))
        print(f"| {name} | {policy} " + fmt(means))
    print()
    print("Per seed against talaria: p50 ÷ talaria's (median, range), seeds not worse, seeds")
    print("where the expired share fell:")
    print()
    print("| workload | policy | p50 ÷ talaria | p50 not worse | share fell |")
    print("|---|---|---|---|---|")
    for (name, policy), per_seed in rows.items():
        if policy != "talaria":
            print(f"| {name} | {policy} " + paired(rows[(name, "talaria")], per_seed))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
