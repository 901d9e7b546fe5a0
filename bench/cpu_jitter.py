"""How steady this machine's CPUs are: the same pure-Python work, timed over and over on each CPU
(docs/fidelity.md, "The machine's own noise").

    .venv/bin/python bench/cpu_jitter.py [--seconds 5] [--json out/cpu-jitter.json]

One unit is a fixed loop (``UNIT_ITERATIONS`` additions) timed with ``perf_counter``; the process
is pinned to one CPU at a time and nothing else of this project runs. A steady CPU gives the same
time every unit. The report gives, per CPU, the units' spread (min, p10, median, p90, max) and
the share of units slower than 1.5× the fastest ("slow"), with the median length of a run of
consecutive slow units. A per-call prediction cannot be closer than the spread of the machine it
is measured on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

UNIT_ITERATIONS = 100_000
SLOW = 1.5
"""A unit this many times slower than the fastest counts as slow."""


def unit() -> int:
    total = 0
    for i in range(UNIT_ITERATIONS):
        total += i
    return total


def sample(cpu: int, seconds: float) -> list[float]:
    """Unit durations (ms) on ``cpu`` for ``seconds``."""
    os.sched_setaffinity(0, {cpu})
    out: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        unit()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def summary(durations: list[float]) -> dict[str, Any]:
    ordered = sorted(durations)
    fastest = ordered[0]
    slow = [d > SLOW * fastest for d in durations]
    runs: list[int] = []
    length = 0
    for is_slow in slow:
        if is_slow:
            length += 1
        elif length:
            runs.append(length)
            length = 0
    if length:
        runs.append(length)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    median = statistics.median(durations)
    return {
        "units": len(durations),
        "min_ms": fastest,
        "p10_ms": q(0.1),
        "median_ms": median,
        "p90_ms": q(0.9),
        "max_ms": ordered[-1],
        "slow_share": sum(slow) / len(slow),
        "slow_run_median_ms": statistics.median(runs) * median if runs else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="Per CPU.")
    parser.add_argument("--json", type=Path, help="Also write the figures here.")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    result = {str(cpu): summary(sample(cpu, args.seconds)) for cpu in cpus}
    print("| CPU | units | min ms | p10 | median | p90 | max | slow (> 1.5× min) "
          "| slow run, median |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for cpu, s in result.items():
        print(
            f"| {cpu} | {s['units']} | {s['min_ms']:.2f} | {s['p10_ms']:.2f} | "
            f"{s['median_ms']:.2f} | {s['p90_ms']:.2f} | {s['max_ms']:.2f} | "
            f"{s['slow_share']:.0%} | {s['slow_run_median_ms']:.0f} ms |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
