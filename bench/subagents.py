"""Sub-agents near their parent (issue 41, item 4): ``talaria`` (routing scores a child's nodes
by its parent's KV too, core/routing/scorers/parent_kv.py) against ``talaria-no-parent`` (the
same router with that scorer's weight 0), over workload seeds and the share of the parent's
prompt a child shares.

    .venv/bin/python bench/subagents.py [--seeds 5] [--first-seed 0]
        [--layouts cluster,spread] [--prefix-shares 0.75] [--json out/subagents.json]

Workload: the ``subagents`` preset (sim/presets.py): the cluster preset's 120 sessions where a
third spawn a sub-agent (sim/subagents.py: median 8 calls, the parent's model, the first
``prefix_share`` of the parent's call-0 prompt shared). Layouts: ``cluster`` = the preset's four
nodes of three models, each model on two; ``spread`` = four nodes each hosting all six models
(every model has four candidates, so a child has more places to land away from its parent).

Prints per layout, prefix share, seed and policy: p50 SCT of every session and of the children,
the children's first calls whose prefix came from the parent's KV, the tokens they reused and
every token the children's calls recomputed; then the sums and means over seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from talaria.core.catalog import load_catalog
from talaria.sim.experiment import run_experiment
from talaria.sim.presets import get_preset
from talaria.sim.subagents import SubagentSpec

POLICIES = ("talaria", "talaria-no-parent")
LAYOUTS = ("cluster", "spread")
COLUMNS = ("p50 SCT", "children p50", "from parent", "reused tok", "recomputed tok")


def row(summary: dict[str, Any]) -> tuple[float, ...]:
    """The printed figures of one policy's summary (``COLUMNS``)."""
    sub = summary["subagents"]
    return (
        summary["p50_sct_s"],
        sub["p50_sct_s"],
        sub["from_parent"] / sub["first_calls"],
        float(sub["reused_tokens"]),
        float(sub["recomputed_tokens"]),
    )


def fmt(values: tuple[float, ...]) -> str:
    """One table row's figures."""
    p50, child, share, reused, recomputed = values
    return f"| {p50:.1f} | {child:.1f} | {share:.2f} | {reused:,.0f} | {recomputed:,.0f} |"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5, help="workload seeds (default 5)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help=f"of {', '.join(LAYOUTS)}")
    parser.add_argument(
        "--prefix-shares", default="0.75", help="shares of the parent's prompt (default 0.75)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write every summary here")
    args = parser.parse_args()
    shares = [float(x) for x in args.prefix_shares.split(",") if x]
    if not shares or not all(0.0 <= x <= 1.0 for x in shares):
        parser.error("--prefix-shares: one or more numbers in [0, 1]")
    layouts = [x for x in args.layouts.split(",") if x]
    if not layouts or any(x not in LAYOUTS for x in layouts):
        parser.error(f"--layouts: of {', '.join(LAYOUTS)}")
    catalog = load_catalog()
    base = get_preset("subagents")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    rows: dict[tuple[str, float, str], list[tuple[float, ...]]] = {}
    out: dict[str, Any] = {}
    print("| layout | prefix share | seed | policy | " + " | ".join(COLUMNS) + " |")
    print("|---|---|---|---|" + "---|" * len(COLUMNS), flush=True)
    for layout in layouts:
        for share in shares:
            preset = replace(base, subagents=replace(SubagentSpec(), prefix_share=share))
            if layout == "spread":
                preset = replace(preset, node_models=None)
            for seed in seeds:
                sessions = preset.sessions(catalog, seed)
                setup = preset.experiment_setup(nodes=4)
                doc = run_experiment(
                    sessions, catalog, setup, POLICIES, include_dedicated=False,
                    include_oracle=False,
                )  # fmt: skip
                for policy in POLICIES:
                    summary = doc["policies"][policy]
                    values = row(summary)
                    rows.setdefault((layout, share, policy), []).append(values)
                    print(f"| {layout} | {share:g} | {seed} | {policy} " + fmt(values), flush=True)
                    out[f"{layout}/{share:g}/{seed}/{policy}"] = {
                        k: v for k, v in summary.items() if k not in ("sct_s", "timeline")
                    }
    print()
    print(f"Over seeds {seeds.start}–{seeds.stop - 1} (means; token columns: sums):")
    print()
    print("| layout | prefix share | policy | " + " | ".join(COLUMNS) + " |")
    print("|---|---|---|" + "---|" * len(COLUMNS))
    for (layout, share, policy), per_seed in rows.items():
        columns = list(zip(*per_seed, strict=True))
        values = tuple(sum(c) if i >= 3 else statistics.fmean(c) for i, c in enumerate(columns))
        print(f"| {layout} | {share:g} | {policy} " + fmt(values))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
