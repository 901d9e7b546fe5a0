"""The fleet's GPUs per layout family over seeds (issue 40), from ``talaria plan``'s documents:

    for s in 0 1 2 3 4; do
        .venv/bin/talaria plan --preset fleet --seed $s --json out/plan-fleet-s$s.json
    done
    .venv/bin/python bench/fleet_plans.py out/plan-fleet-s*.json

Prints, as Markdown: per seed, each family's GPUs (``talaria``, ``static``, ``dedicated``,
``dedicated_node``), Talaria's ÷ the right-sized dedicated's, the memory minimum and the
plans' groups; the medians; then the GPUs each family needs at looser SLOs (every model's
p95 ≤ x × its p95 on a whole node of its own), read off the same replays.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

FAMILIES = ("talaria", "static", "dedicated", "dedicated_node")
LOOSER = (1.5, 2.0, 2.5)


def gpus_at(doc: dict[str, Any], family: str, x: float) -> int | None:
    """The fewest GPUs of ``family``'s evaluated layouts (Talaria's: with the whole-node
    packings and the dedicated groups, sim/plan.py) where every model's p95 ≤ x × its
    reference p95."""
    reach = doc["reference"]["p95_by_model"]
    kinds = ("talaria", "static", "dedicated") if family == "talaria" else (family,)
    meeting = [
        p["gpus"]
        for p in doc["points"]
        if p["family"] in kinds
        and all(p["p95_by_model"][m] <= x * bound for m, bound in reach.items())
    ]
    return min(meeting) if meeting else None


def groups(plan: dict[str, Any] | None) -> str:
    """``8×6 4×7 2×3``: the plan's group sizes and counts."""
    if plan is None:
        return "–"
    sizes = plan["gpus_per_node"]
    return " ".join(f"{s}×{sizes.count(s)}" for s in sorted(set(sizes), reverse=True))


def shared(plan: dict[str, Any] | None) -> str:
    """The groups of the plan that host more than one model."""
    if plan is None:
        return "–"
    together = [f"{'+'.join(g['models'])} on {g['group_gpus']}" for g in plan["groups"]
                if len(g["models"]) > 1]  # fmt: skip
    return "; ".join(together) or "none"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plans", nargs="+", type=Path, help="talaria plan --json documents")
    args = parser.parse_args(argv)
    docs = sorted((json.loads(p.read_text()) for p in args.plans), key=lambda d: d["seed"])
    print("| seed | talaria | static | dedicated | dedicated_node | talaria ÷ dedicated | "
          "memory minimum | dedicated's groups | talaria's shared groups |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for doc in docs:
        plans = doc["plans"]
        got = {f: plans[f]["gpus"] if plans[f] else None for f in FAMILIES}
        ratio = got["talaria"] / got["dedicated"] if got["talaria"] and got["dedicated"] else None
        if ratio is not None:
            ratios.append(ratio)
        cells = [str(got[f]) if got[f] is not None else "none" for f in FAMILIES]
        print(f"| {doc['seed']} | {' | '.join(cells)} | "
              f"{f'{ratio:.2f}' if ratio is not None else '–'} | "
              f"{doc['memory_minimum']['gpus']} | {groups(plans['dedicated'])} | "
              f"{shared(plans['talaria'])} |")  # fmt: skip
    medians = [
        statistics.median(g) if (g := [d["plans"][f]["gpus"] for d in docs if d["plans"][f]])
        else None
        for f in FAMILIES
    ]  # fmt: skip
    print(f"| median | {' | '.join(f'{m:g}' if m is not None else '–' for m in medians)} | "
          f"{statistics.median(ratios):.2f} | | | |" if ratios else "")  # fmt: skip
    print()
    print("| SLO: every model's p95 ≤ x × its whole-node p95 | " + " | ".join(FAMILIES)
          + " | median talaria ÷ dedicated |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for x in LOOSER:
        per = {f: [gpus_at(d, f, x) for d in docs] for f in FAMILIES}
        shares = [t / d for t, d in zip(per["talaria"], per["dedicated"], strict=True) if t and d]
        cells = ["/".join(str(g) if g is not None else "–" for g in per[f]) for f in FAMILIES]
        share = f"{statistics.median(shares):.2f}" if shares else "–"
        print(f"| {x:g}× | {' | '.join(cells)} | {share} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
