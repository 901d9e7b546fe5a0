"""Fairness under saturation (issue 38): each tenant's session completion times alone, and
beside the others with and without the fair queue (runtime/scheduling/fairness.py).

    .venv/bin/python bench/fairness.py --preset noisy --seeds 20 [--json out/fairness.json]
    .venv/bin/python bench/fairness.py --preset saturated --seeds 5
    .venv/bin/python bench/fairness.py --preset noisy --preempt-limit 1000000   # no count limit
    .venv/bin/python bench/fairness.py --preset noisy --class-slowdown 1.4

The interactive tenant has 10 sessions, so its p50 is one or two of them: take 20 seeds
(docs/results.md §11, round four), not 5.

For each seed: the preset's sessions are replayed (``talaria replay``'s experiment, one node)
under ``talaria`` and ``-fair_queue`` (the same scheduler with the fair queue off), and, with
several tenants, each tenant's sessions alone under ``talaria``. Printed per seed and as the
median over seeds:

- noisy neighbours (several tenants): per tenant, p50 / p95 / mean SCT beside the others ÷
  alone, with and without the fair queue (ours: each tenant against itself alone); and the
  peers' yardstick, as llm-d reports its flow control (premium against standard at
  saturation): per tenant, its calls' p50 / p95 time to first token and mean queue wait beside
  the others, in seconds (``peers``);
- one tenant (``saturated``): the fair queue's mean, p95 and calls completed ÷ without it,
  and the p50 SCT of the short sessions (the quarter with the fewest calls) without ÷ with.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from talaria.core.catalog import load_catalog
from talaria.core.trace import SessionTrace
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.sim.experiment import run_experiment
from talaria.sim.metrics import percentile
from talaria.sim.presets import get_preset

POLICIES = ("talaria", "-fair_queue")
DEFAULTS = SchedulerConfig()
Overrides = dict[str, Any]
"""SchedulerConfig fields the nodes take other than their defaults (``--preempt-limit``,
``--class-slowdown``)."""


def _replay(
    sessions: list[SessionTrace], preset: Any, catalog: Any, overrides: Overrides
) -> dict[str, Any]:
    setup = preset.experiment_setup(1, sessions, catalog)
    config = SchedulerConfig(quantum_s=setup.quantum_s, **overrides)
    return run_experiment(
        sessions, catalog, setup, POLICIES, include_dedicated=False, config=config
    )


def _ratios(beside: dict[str, float], alone: dict[str, float]) -> dict[str, float]:
    return {k: beside[f"{k}_sct_s"] / alone[f"{k}_sct_s"] for k in ("p50", "p95", "mean")}


PEERS = ("p50_ttft_s", "p95_ttft_s", "mean_queue_s")
"""The peers' yardstick: a tenant's calls' time to first token and queue wait beside the
others, seconds (sim/experiment.py ``_groups``)."""


def noisy(
    preset: Any, catalog: Any, seed: int, overrides: Overrides | None = None
) -> dict[str, Any]:
    """Per tenant: SCT beside the others ÷ alone, with and without the fair queue, and the
    peers' yardstick beside the others (``peers``)."""
    sessions = preset.sessions(catalog, seed)
    mixed = _replay(sessions, preset, catalog, overrides or {})["policies"]
    out: dict[str, Any] = {}
    for tenant in sorted({s.tenant for s in sessions}):
        own = [s for s in sessions if s.tenant == tenant]
        alone = _replay(own, preset, catalog, overrides or {})["policies"]["talaria"]
        alone = alone["tenants"][tenant]
        out[tenant] = {
            "alone": alone,
            **{p: _ratios(mixed[p]["tenants"][tenant], alone) for p in POLICIES},
            "peers": {p: {k: mixed[p]["tenants"][tenant][k] for k in PEERS} for p in POLICIES},
        }
    return out


def saturated(
    preset: Any, catalog: Any, seed: int, overrides: Overrides | None = None
) -> dict[str, Any]:
    """The fair queue against ``-fair_queue`` on one tenant's saturating sessions."""
    sessions = preset.sessions(catalog, seed)
    doc = _replay(sessions, preset, catalog, overrides or {})["policies"]
    on, off = doc["talaria"], doc["-fair_queue"]
    cut = percentile([float(s.num_calls) for s in sessions], 25)
    short = [s.session_id for s in sessions if s.num_calls <= cut]
    short_p50 = {p: percentile([doc[p]["sct_s"][k] for k in short], 50) for p in POLICIES}
    return {
        "mean": on["mean_sct_s"] / off["mean_sct_s"],
        "p95": on["p95_sct_s"] / off["p95_sct_s"],
        "calls": on["calls_completed"] / off["calls_completed"],
        "short_speedup_p50": short_p50["-fair_queue"] / short_p50["talaria"],
        "short_calls_at_most": cut,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="noisy")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--preempt-limit", type=int, default=DEFAULTS.preempt_limit,
        help=f"the nodes' SchedulerConfig.preempt_limit: how many times a running call may be "
        f"held out of an engine's steps for a higher class (fairness rule 5; 0: never; "
        f"default {DEFAULTS.preempt_limit})",
    )  # fmt: skip
    parser.add_argument(
        "--class-slowdown", type=float, default=DEFAULTS.class_slowdown,
        help=f"the nodes' SchedulerConfig.class_slowdown: the most a lower class may slow a "
        f"higher class's decode steps (fairness rules 4 and 5; default "
        f"{DEFAULTS.class_slowdown})",
    )  # fmt: skip
    args = parser.parse_args()
    overrides = {"preempt_limit": args.preempt_limit, "class_slowdown": args.class_slowdown}
    catalog = load_catalog([])
    preset = get_preset(args.preset)
    runs: dict[int, dict[str, Any]] = {}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        measure = noisy if preset.tenants else saturated
        runs[seed] = measure(preset, catalog, seed, overrides)
        print(f"seed {seed}: {json.dumps(runs[seed], default=_short)}", file=sys.stderr)
    summary = _median(runs, bool(preset.tenants))
    print(json.dumps(summary, indent=2, default=_short))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"preset": args.preset, "runs": runs,
                                         "median": summary}, indent=2))  # fmt: skip


def _median(runs: dict[int, dict[str, Any]], tenants: bool) -> dict[str, Any]:
    """The median over seeds of every ratio."""
    first = next(iter(runs.values()))
    if not tenants:
        return {k: statistics.median(r[k] for r in runs.values()) for k in first}
    return {
        tenant: {
            **{p: _median_of(r[tenant][p] for r in runs.values()) for p in POLICIES},
            "peers": {
                p: _median_of(r[tenant]["peers"][p] for r in runs.values()) for p in POLICIES
            },
        }
        for tenant in first
    }


def _median_of(rows: Iterable[dict[str, float]]) -> dict[str, float]:
    """Each key's median over ``rows``."""
    rows = list(rows)
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def _short(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else str(value)


if __name__ == "__main__":
    main()
