"""How well the calibrated co-resident interference α predicts co-resident step times.

    .venv-vllm/bin/python bench/fidelity/coresident.py out/fid-seeds/seed-{3,4,5,6,7}

Reads each run's calibration.json (``talaria calibrate --report``: the co-resident decode
points, one model's step alone and beside the other's decode) and prints, per run, α and how
well it predicts that run's own points, then the cross-run check: every run's points predicted
with every *other* run's α, ``|alone × (1 + α) − shared| ÷ shared``.
"""

from __future__ import annotations

import itertools
import json
import statistics as st
import sys
from pathlib import Path


def main(runs: list[Path]) -> None:
    cal = {r: json.loads((r / "calibration.json").read_text()) for r in runs}
    print("| run | α (median ratio − 1) | points | in-run |error| median / max |")
    print("|---|---|---|---|")
    for run, doc in cal.items():
        errors = [p["abs_rel_error"] for p in doc["coresident"]]
        alpha = doc["coresident_interference"]
        print(
            f"| {run.name} | {alpha:.2f} | {len(errors)} | "
            f"{st.median(errors):.1%} / {max(errors):.1%} |"
        )
    cross = sorted(
        abs(p["alone_s"] * (1 + cal[i]["coresident_interference"]) - p["shared_s"]) / p["shared_s"]
        for i, j in itertools.permutations(runs, 2)
        for p in cal[j]["coresident"]
    )
    if cross:
        print(
            f"cross-run (α of one run, points of another): |error| median "
            f"{st.median(cross):.1%}, p95 {cross[int(0.95 * len(cross))]:.1%}, "
            f"max {cross[-1]:.1%}, n={len(cross)}"
        )


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
