"""Where a fidelity run's per-call error comes from (bench/fidelity/run.py output directory).

    .venv-vllm/bin/python bench/fidelity/decompose.py out/fidelity [out/fidelity-2 ...]

Reads each run's comparison (fidelity.json: every call's predicted parts) and the proxy's store
(live.db: the runtime's own split of every call, on its clock) and breaks each call's latency
into the same parts on both sides:

- queue: arrival at the node → admitted (slot waits included);
- intake + prefill: admitted → first token;
- decode: first → last token;
- hop: the proxy's latency − the runtime's arrival → finish (the HTTP hop, the proxy's and the
  runtime API's work), against the profile's transport the replay adds.

For each part it prints the medians of the measured and predicted seconds, the median of
(predicted − measured) per call, and that part's share of the summed |error| over calls
(Σ|pred − meas| of the part ÷ Σ over parts): which term holds the per-call error.
"""

from __future__ import annotations

import json
import sqlite3
import statistics as st
import sys
from pathlib import Path
from typing import Any

PARTS = ("queue", "intake + prefill", "decode", "hop")


def parts(out: Path) -> list[dict[str, tuple[float, float]]]:
    """Per call: part → (measured s, predicted s)."""
    doc = json.loads((out / "fidelity.json").read_text())
    db = sqlite3.connect(out / "live.db")
    rows = {
        (r[0], r[1]): r[2:]
        for r in db.execute(
            "select session_id, call_index, queue_s, prefill_s, decode_s from calls "
            "where status = 'ok'"
        )
    }
    out_rows = []
    for c in doc["calls"]:
        queue_s, prefill_s, decode_s = rows[(c["session_id"], c["call_index"])]
        hop_s = c["measured_latency_s"] - (queue_s + prefill_s + decode_s)
        out_rows.append(
            {
                "queue": (queue_s, c["predicted_queue_s"]),
                "intake + prefill": (prefill_s, c["predicted_prefill_s"]),
                "decode": (decode_s, c["predicted_decode_s"]),
                "hop": (hop_s, c["predicted_hop_s"]),
            }
        )
    return out_rows


def table(calls: list[dict[str, tuple[float, float]]]) -> str:
    total = sum(abs(p - m) for c in calls for m, p in c.values())
    lines = [
        "| part | measured, median ms | predicted, median ms | pred − meas, median ms "
        "| share of Σ|error| |",
        "|---|---|---|---|---|",
    ]
    for part in PARTS:
        meas = [c[part][0] for c in calls]
        pred = [c[part][1] for c in calls]
        diff = [p - m for m, p in zip(meas, pred, strict=True)]
        share = sum(abs(d) for d in diff) / total if total else 0.0
        lines.append(
            f"| {part} | {st.median(meas) * 1e3:.1f} | {st.median(pred) * 1e3:.1f} "
            f"| {st.median(diff) * 1e3:+.1f} | {share:.0%} |"
        )
    return "\n".join(lines)


def main(args: list[str]) -> dict[str, Any]:
    calls = [c for a in args for c in parts(Path(a))]
    print(f"{len(calls)} calls from {len(args)} run(s)")
    print(table(calls))
    return {"calls": len(calls)}


if __name__ == "__main__":
    main(sys.argv[1:])
