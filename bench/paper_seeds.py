"""Replay the paper preset over several workload seeds: how stable are the speedups?

    .venv/bin/python bench/paper_seeds.py --seeds 10 [--first-seed 0] [--sessions 60]
        [--policy=-demand_slots] [--quantum-s 60] [--json out/seeds.json]

Prints one row per seed (round / talaria / dedicated p50 and p95 SCT, speedups, talaria ÷
dedicated) and the median, min and max over seeds. ``--sessions`` changes the session count,
keeping the preset's calls per session.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from talaria.core.catalog import load_catalog
from talaria.sim.experiment import ExperimentSetup, run_experiment
from talaria.sim.presets import get_preset
from talaria.sim.workload import generate_sessions


def columns(policy: str) -> tuple[tuple[str, Callable[[dict[str, Any]], float]], ...]:
    """The printed figures: round's, ``policy``'s, and ``policy`` ÷ dedicated and ÷ oracle."""

    def of(key: str) -> Callable[[dict[str, Any]], float]:
        return lambda d: float(d["policies"][policy][key])

    return (
        ("round p50", lambda d: d["policies"]["round"]["p50_sct_s"]),
        ("round p95", lambda d: d["policies"]["round"]["p95_sct_s"]),
        (f"{policy} p50"[-14:], of("p50_sct_s")),
        (f"{policy} p95"[-14:], of("p95_sct_s")),
        ("speedup p50", of("speedup_p50")),
        ("speedup p95", of("speedup_p95")),
        ("÷ded p50", lambda d: d["policies"][policy]["p50_sct_s"] / d["dedicated"]["p50_sct_s"]),
        ("÷oracle p50", of("oracle_ratio_p50")),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument(
        "--policy", default="talaria", help="The policy set against round and dedicated."
    )
    parser.add_argument("--sessions", type=int, default=None)
    parser.add_argument("--quantum-s", type=float, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--catalog", type=Path, action="append", default=[], help="extra catalog folder or TOML"
    )
    args = parser.parse_args()
    catalog = load_catalog(args.catalog)
    preset = get_preset(args.preset)
    if args.quantum_s is not None:
        preset = replace(preset, quantum_s=args.quantum_s)
    if args.sessions is not None:
        w = preset.workload
        total = round(w.total_calls * args.sessions / w.sessions)
        preset = replace(preset, workload=replace(w, sessions=args.sessions, total_calls=total))
    models = [catalog.model(m) for m in preset.workload.models]
    setup = ExperimentSetup(
        preset.server, preset.profile, preset.workload.models, quantum_s=preset.quantum_s
    )
    rows = []
    cols = columns(args.policy)
    print("seed " + " ".join(f"{name:>14}" for name, _ in cols))
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        sessions = generate_sessions(
            preset.workload,
            {m.name: m.context_window_tokens for m in models},
            {m.name: m.reasoning for m in models},
            seed,
        )
        doc = run_experiment(sessions, catalog, setup, ["round", args.policy])
        row = {name: fn(doc) for name, fn in cols}
        rows.append(row)
        print(f"{seed:4d} " + " ".join(f"{row[name]:14.2f}" for name, _ in cols))
    for label, agg in (("median", statistics.median), ("min", min), ("max", max)):
        values = [agg([r[name] for r in rows]) for name, _ in cols]
        print(f"{label:>4} " + " ".join(f"{v:14.2f}" for v in values))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
