"""Where one tenant's time goes on a shared node (issue 49): its calls' parts summed, alone and
beside the others, and the node's model switches.

    .venv/bin/python bench/fairness_breakdown.py --preset noisy --seed 0 --tenant ide

The preset's sessions for ``--seed`` are replayed under ``--policy`` (``talaria`` by default)
three ways: the tenant's own sessions alone, the other tenants' alone, and all of them
together (``bench/fairness.py``'s replays). Printed per way, for the tenant's calls (none for
the others-alone replay): calls; seconds of queue (arrival to admission) and of it the wait
for the model's slot; admission to first token; first token to finish (decode); KV restored
from host memory (GB) and the admission-to-first-token seconds of the calls that restored it
(``restoring_s``, part of the first-token seconds); the node's switches (activations after
the first slot's) and their seconds; and its slots closed for a higher class (``outranked``)
with the seconds from those closes to the next slot's switch (``drain_s``: the running calls
the closed slot lets finish).
"""

from __future__ import annotations

import argparse
from itertools import pairwise
from typing import Any

from talaria.core.catalog import load_catalog
from talaria.core.trace import SessionTrace
from talaria.core.types import CallResult
from talaria.sim.experiment import run_experiment
from talaria.sim.presets import get_preset


def outranked_drains(timeline: list[dict[str, Any]]) -> list[float]:
    """Per slot closed for a higher class (one node's ``timeline``, in order), the seconds from
    its close to the next slot's switch: ``next.start_s − next.switch_s − end_s`` (a slot opens
    once its switch is done)."""
    return [
        max(0.0, after["start_s"] - after["switch_s"] - slot["end_s"])
        for slot, after in pairwise(timeline)
        if slot["close"] == "outranked"
    ]


def breakdown(
    sessions: list[SessionTrace], preset: Any, catalog: Any, tenant: str, policy: str
) -> dict[str, float]:
    """Replay ``sessions`` (one node, the preset's setup): the tenant's calls' parts summed
    (seconds; ``restored_gb``) and the node's switches."""
    tenant_of = {s.session_id: s.tenant for s in sessions}
    mine: list[CallResult] = []

    def heard(result: CallResult) -> None:
        if tenant_of.get(result.session_key) == tenant:
            mine.append(result)

    setup = preset.experiment_setup(1, sessions, catalog)
    doc = run_experiment(
        sessions, catalog, setup, (policy,), on_call=heard, include_dedicated=False,
        include_oracle=False,
    )["policies"][policy]  # fmt: skip
    drains = outranked_drains(doc["timeline"])
    return {
        "calls": float(len(mine)),
        "queue_s": sum(c.queue_s for c in mine),
        "slot_wait_s": sum(c.slot_wait_s for c in mine),
        "to_first_token_s": sum(c.first_token_s - c.admitted_s for c in mine),
        "decode_s": sum(c.finished_s - c.first_token_s for c in mine),
        "restored_gb": sum(c.restored_bytes for c in mine) / 1e9,
        "restoring_s": sum(c.first_token_s - c.admitted_s for c in mine if c.restored_bytes),
        "switches": float(doc["switches"]),
        "switch_s": float(doc["switch_s_total"]),
        "outranked": float(len(drains)),
        "drain_s": sum(drains),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="noisy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tenant", default="ide")
    parser.add_argument("--policy", default="talaria")
    args = parser.parse_args()
    catalog = load_catalog([])
    preset = get_preset(args.preset)
    sessions = preset.sessions(catalog, args.seed)
    ways = {
        "alone": [s for s in sessions if s.tenant == args.tenant],
        "others alone": [s for s in sessions if s.tenant != args.tenant],
        "together": sessions,
    }
    if not ways["alone"]:
        parser.error(f"no session of tenant {args.tenant!r} in preset {args.preset!r}")
    for way, chosen in ways.items():
        if not chosen:
            continue
        row = breakdown(chosen, preset, catalog, args.tenant, args.policy)
        print(f"{way:13} " + "  ".join(f"{k} {v:,.1f}" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
