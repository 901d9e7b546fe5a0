"""How long a model without calls stays placed before it scales to zero (issue 48; pure).

Each model's keep-alive is learned from its own arrivals, as the hybrid histogram policy of
Shahrad et al. ("Serverless in the Wild", USENIX ATC'20) keeps an application warm for the
99th percentile of its idle times plus a margin:

    keep_alive_m = clamp(KEEP_ALIVE_MARGIN × p99(gaps_m), floor_s, ceiling_s)

with ``gaps_m`` the times between consecutive calls of m in the demand window, ``floor_s`` the
operator's least keep-alive (``placement_keep_alive_s``; also a model's keep-alive while it
has fewer than two calls in the window) and ``ceiling_s`` the demand window (the meter sees
no further back). A model scales to zero on a node once it has had no call for its
keep-alive, has no live session there and was placed at least that long ago
(core/placement/controller.py, rule 0).
"""

from __future__ import annotations

from collections.abc import Sequence

KEEP_ALIVE_QUANTILE = 0.99
KEEP_ALIVE_MARGIN = 1.1
"""The 99th percentile of idle times plus 10 %: the ATC'20 policy's (docs/sources.md §16)."""


def gap_quantile(gaps: Sequence[float], q: float = KEEP_ALIVE_QUANTILE) -> float | None:
    """The ``q`` quantile of ``gaps`` (nearest rank); None when there is none."""
    if not gaps:
        return None
    ordered = sorted(gaps)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))]


def keep_alive_s(gap_s: float | None, floor_s: float, ceiling_s: float) -> float:
    """``keep_alive_m`` (module docstring) from the model's gap quantile ``gap_s`` (None: not
    enough calls to have one)."""
    if floor_s <= 0:
        raise ValueError(f"the keep-alive floor must be > 0 s, got {floor_s:g}")
    if gap_s is None:
        return floor_s
    return min(max(KEEP_ALIVE_MARGIN * gap_s, floor_s), max(ceiling_s, floor_s))
