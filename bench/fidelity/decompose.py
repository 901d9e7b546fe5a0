"""Where a fidelity run's per-call error comes from (bench/fidelity/run.py output directory).

    .venv-vllm/bin/python bench/fidelity/decompose.py out/fidelity [out/fidelity-2 ...]

Reads each run's comparison (fidelity.json: every call's predicted parts) and the proxy's store
(live.db: the runtime's own split of every call, on its clock, and vLLM's EngineCore timestamps
of it) and breaks each call's latency into the same parts on both sides:

- queue: arrival at the node → admitted (slot waits included);
- intake + prefill: admitted → first token;
- decode: first → last token;
- hop: the proxy's latency − the runtime's arrival → finish (the HTTP hop, the proxy's and the
  runtime API's work), against the profile's transport the replay adds.

For each part it prints the medians of the measured and predicted seconds, the median of
(predicted − measured) per call, and that part's share of the summed |error| over calls
(Σ|pred − meas| of the part ÷ Σ over parts): which term holds the per-call error.

Where the store has the engine's own timestamps (``calls.engine_*``, ``core.types.EngineTimes``)
a second table splits both sides at the engine's milestones (the simulated engine reports its
own):

- until its first step: admitted → the step that first took the call began (live: the runtime
  and vLLM's front end hand it over, then it waits for the step in flight to end; replay: the
  intake, then the wait for the next step boundary);
- first step: that step, to the engine's first-token output;
- first-token delivery: that output → the runtime hears of it (the replay has none);
- engine decode: the engine's first-token → last-token outputs;
- decode delivery: the runtime's decode − the engine's (the replay has none).
"""

from __future__ import annotations

import json
import sqlite3
import statistics as st
import sys
from pathlib import Path
from typing import Any

PARTS = ("queue", "intake + prefill", "decode", "hop")
ENGINE_PARTS = (
    "until its first step",
    "first step",
    "first-token delivery",
    "engine decode",
    "decode delivery",
)


def parts(out: Path) -> list[dict[str, tuple[float, float]]]:
    """Per call: part → (measured s, predicted s), the engine-timed parts too where both
    sides have them."""
    doc = json.loads((out / "fidelity.json").read_text())
    db = sqlite3.connect(out / "live.db")
    columns = {r[1] for r in db.execute("pragma table_info(calls)")}
    engine = "engine_decode_s" in columns
    extra = ", engine_intake_s, engine_queue_s, engine_prefill_s, engine_decode_s" if engine else ""
    key = "session_key" if "session_key" in columns else "session_id"  # before migration 0008
    rows = {
        (r[0], r[1]): r[2:]
        for r in db.execute(
            f"select {key}, call_index, queue_s, prefill_s, decode_s"
            f"{extra} from calls where status = 'ok'"
        )
    }
    out_rows = []
    for c in doc["calls"]:
        row = rows[(c["session_id"], c["call_index"])]  # the trace's session: the store's key
        queue_s, prefill_s, decode_s = row[:3]
        hop_s = c["measured_latency_s"] - (queue_s + prefill_s + decode_s)
        call = {
            "queue": (queue_s, c["predicted_queue_s"]),
            "intake + prefill": (prefill_s, c["predicted_prefill_s"]),
            "decode": (decode_s, c["predicted_decode_s"]),
            "hop": (hop_s, c["predicted_hop_s"]),
        }
        if engine and row[6] is not None and "predicted_step_s" in c:
            intake, e_queue, e_prefill, e_decode = row[3:7]
            call |= {
                "until its first step": (
                    intake + e_queue,
                    c["predicted_intake_s"] + c["predicted_wait_s"],
                ),
                "first step": (e_prefill, c["predicted_step_s"]),
                "first-token delivery": (prefill_s - intake - e_queue - e_prefill, 0.0),
                "engine decode": (e_decode, c["predicted_decode_s"]),
                "decode delivery": (decode_s - e_decode, 0.0),
            }
        out_rows.append(call)
    return out_rows


def table(calls: list[dict[str, tuple[float, float]]], parts: tuple[str, ...] = PARTS) -> str:
    """Medians per part and each part's share of the summed |error| (module docstring)."""
    total = sum(abs(c[p][1] - c[p][0]) for c in calls for p in parts)
    lines = [
        "| part | measured, median ms | predicted, median ms | pred − meas, median ms "
        "| share of Σ|error| |",
        "|---|---|---|---|---|",
    ]
    for part in parts:
        meas = [c[part][0] for c in calls]
        pred = [c[part][1] for c in calls]
        diff = [p - m for m, p in zip(meas, pred, strict=True)]
        share = sum(abs(d) for d in diff) / total if total else 0.0
        lines.append(
            f"| {part} | {st.median(meas) * 1e3:.1f} | {st.median(pred) * 1e3:.1f} "
            f"| {st.median(diff) * 1e3:+.1f} | {share:.0%} |"
        )
    return "\n".join(lines)


def engine_table(calls: list[dict[str, tuple[float, float]]]) -> str:
    """The parts at the engine's milestones (module docstring), for the calls that have them."""
    timed = [c for c in calls if "first step" in c]
    if not timed:
        return "(no engine timestamps in the store)"
    return f"{len(timed)} calls with the engine's own timestamps\n" + table(timed, ENGINE_PARTS)


def main(args: list[str]) -> dict[str, Any]:
    calls = [c for a in args for c in parts(Path(a))]
    print(f"{len(calls)} calls from {len(args)} run(s)")
    print(table(calls))
    print()
    print(engine_table(calls))
    return {"calls": len(calls)}


if __name__ == "__main__":
    main(sys.argv[1:])
