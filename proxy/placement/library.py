"""What the live placement controller (proxy/placement/loop.py) reads besides the runtimes'
statuses: the model library it may place, and the demand the runtimes metered (pure)."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LIBRARY_ONLY_KEYS = ("weight_bytes",)
"""Library entry keys for the controller, not sent to the runtime."""


def load_library(path: str | Path) -> dict[str, dict[str, Any]]:
    """The model library: a TOML file of ``[[model]]`` entries as a node config writes them
    (``name``, ``engine``, ``path``, the engine's options; paths as the runtimes see them),
    each with an optional ``weight_bytes``; ``ValueError`` names what is wrong."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"model library {file}: {exc}") from exc
    entries = data.get("model")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"model library {file}: no [[model]] entries")
    library: dict[str, dict[str, Any]] = {}
    for entry in entries:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"model library {file}: every [[model]] needs a name")
        if name in library:
            raise ValueError(f"model library {file}: model {name!r} is listed twice")
        weight = entry.get("weight_bytes", 0)
        if not isinstance(weight, int | float) or isinstance(weight, bool) or weight < 0:
            raise ValueError(f"model library {file}: model {name!r}: weight_bytes must be ≥ 0")
        library[name] = dict(entry)
    return library


@dataclass(frozen=True)
class FleetDemand:
    """What the runtimes' demand documents say together (``merge_demand``)."""

    demand: dict[str, float]
    call_s: dict[str, float]
    idle_s: dict[str, float]
    """Model → seconds since its last call on any runtime (absent: none in the window)."""
    gap_p99_s: dict[str, float]
    """Model → the 99th percentile of the times between its calls, the largest of the
    runtimes' (one runtime sees a model's calls no closer than all of them do)."""


def merge_demand(documents: Iterable[Mapping[str, Any]]) -> FleetDemand:
    """``d_m`` and ``c_m`` of the fleet from the runtimes' demand documents (``GET
    /v1/runtime/demand``): ``d_m = Σ_r demand_r[m]`` (a session counts once per runtime it
    called), ``c_m = Σ_r n_r[m] · call_s_r[m] / Σ_r n_r[m]`` with ``n_r`` the calls finished
    (absent where no call finished); a model's idleness, the least of the runtimes', and its
    gap quantile, the largest."""
    demand: dict[str, float] = {}
    calls: dict[str, tuple[float, float]] = {}  # model → (finished calls, their seconds)
    idle: dict[str, float] = {}
    gaps: dict[str, float] = {}
    for doc in documents:
        for model, sessions in (doc.get("demand") or {}).items():
            demand[model] = demand.get(model, 0.0) + float(sessions)
        means = doc.get("call_s") or {}
        for model, n in (doc.get("finished_calls") or {}).items():
            done, total = calls.get(model, (0.0, 0.0))
            calls[model] = (done + n, total + n * float(means.get(model, 0.0)))
        for model, seconds in (doc.get("idle_s") or {}).items():
            idle[model] = min(idle.get(model, float("inf")), float(seconds))
        for model, seconds in (doc.get("gap_p99_s") or {}).items():
            gaps[model] = max(gaps.get(model, 0.0), float(seconds))
    call_s = {m: total / n for m, (n, total) in calls.items() if n > 0}
    return FleetDemand(demand, call_s, idle, gaps)
