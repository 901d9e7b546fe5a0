"""Where a fidelity run's per-call error comes from (bench/fidelity/run.py output directory).

    .venv-vllm/bin/python bench/fidelity/decompose.py out/fidelity

Reads the run's comparison (fidelity.json) and the proxy's store (live.db: the runtime's
queue/prefill/decode split of every call) and prints, as medians over calls:

- decode: measured decode time (first → last token, runtime clock) / predicted;
- serving path: the proxy's latency − the runtime's queue + prefill + decode (the HTTP hop and
  the proxy's own work), against the hop the replay adds (the profile's transport);
- node: predicted latency without the hop / the runtime's latency − 1 (the engine and
  scheduler model alone);
- TTFT of calls that waited for no slot (both sides under 80 ms), measured and predicted;
- slot waits: calls whose TTFT is 80 ms or more on each side, how many agree, and the summed
  waits.
"""

from __future__ import annotations

import json
import sqlite3
import statistics as st
import sys
import tomllib
from pathlib import Path


def main() -> None:
    out = Path(sys.argv[1])
    doc = json.loads((out / "fidelity.json").read_text())
    profile = tomllib.loads((out / "profile.toml").read_text())["profile"]
    hop = profile.get("transport_forward_s", 0.0) + profile.get("transport_return_s", 0.0)
    db = sqlite3.connect(out / "live.db")
    rows = {
        (r[0], r[1]): r[2:]
        for r in db.execute(
            "select session_id, call_index, queue_s, prefill_s, decode_s from calls "
            "where status = 'ok'"
        )
    }
    decode, serving, node, ttft = [], [], [], []
    waited = [(c["measured_ttft_s"] >= 0.08, c["predicted_ttft_s"] >= 0.08) for c in doc["calls"]]
    wait_meas = sum(c["measured_ttft_s"] for c in doc["calls"] if c["measured_ttft_s"] >= 0.08)
    wait_pred = sum(c["predicted_ttft_s"] for c in doc["calls"] if c["predicted_ttft_s"] >= 0.08)
    for c in doc["calls"]:
        queue_s, prefill_s, decode_s = rows[(c["session_id"], c["call_index"])]
        runtime_s = queue_s + prefill_s + decode_s
        decode.append(decode_s / (c["predicted_latency_s"] - hop - c["predicted_ttft_s"]))
        serving.append(c["measured_latency_s"] - runtime_s)
        node.append((c["predicted_latency_s"] - hop) / runtime_s - 1)
        if c["measured_ttft_s"] < 0.08 and c["predicted_ttft_s"] < 0.08:
            ttft.append((c["measured_ttft_s"], c["predicted_ttft_s"]))
    print(f"decode time measured / predicted, median: {st.median(decode):.3f}")
    print(
        f"serving path (proxy latency - runtime latency), median: {st.median(serving) * 1e3:.1f}"
        f" ms; the replay adds {hop * 1e3:.1f} ms"
    )
    print(
        f"node-level latency error: median |err| {st.median(abs(e) for e in node):.1%}, "
        f"signed {st.median(node):+.1%}"
    )
    print(
        f"TTFT without a slot wait ({len(ttft)} calls): measured "
        f"{st.median(m for m, _ in ttft) * 1e3:.1f} ms, predicted "
        f"{st.median(p for _, p in ttft) * 1e3:.1f} ms"
    )
    print(
        f"slot waits: {sum(m for m, _ in waited)} calls measured, {sum(p for _, p in waited)} "
        f"predicted, {sum(m == p for m, p in waited)}/{len(waited)} agree; summed "
        f"{wait_meas:.1f} s measured, {wait_pred:.1f} s predicted "
        f"({(wait_pred - wait_meas) / wait_meas:+.1%})"
    )


if __name__ == "__main__":
    main()
