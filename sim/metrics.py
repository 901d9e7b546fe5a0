"""Summaries of a replay: session completion time (SCT) percentiles and per-policy counters."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default): rank = q/100 × (n − 1)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean; NaN for no values."""
    return sum(values) / len(values) if values else math.nan


def sct_summary(sct_s: Sequence[float]) -> dict[str, float]:
    """p50, p95 and mean of the sessions' completion times (seconds in, seconds out)."""
    return {
        "p50_sct_s": percentile(sct_s, 50),
        "p95_sct_s": percentile(sct_s, 95),
        "mean_sct_s": mean(sct_s),
    }
