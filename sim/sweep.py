"""Sensitivity sweeps: rerun ``round``, ``talaria`` and ``dedicated`` with one parameter varied.

Parameters (none of them is given by the paper, or each is an estimate):
- ``quantum_s``: slot quantum of the round scheduler;
- ``sessions``: session count (calls scale with it at the preset's calls per session);
- ``mean_interarrival_s``: Poisson arrival spacing (0 = all at once);
- ``zipf_s``: model popularity skew;
- ``weight_bw_scale``: multiplies the calibrated sleep-mode weight wake/sleep rates (1 = the
  A100 measurement; ~2 would be a Gen5 link at the same efficiency);
- ``compute_efficiency``, ``memory_efficiency``, ``step_overhead_s``: the cost-model profile.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from talaria.core.catalog import Catalog
from talaria.core.trace import SessionTrace
from talaria.sim.experiment import OnCall, run_experiment
from talaria.sim.presets import Preset
from talaria.sim.workload import WorkloadSpec

SWEEP_PARAMS = (
    "quantum_s",
    "sessions",
    "mean_interarrival_s",
    "zipf_s",
    "weight_bw_scale",
    "compute_efficiency",
    "memory_efficiency",
    "step_overhead_s",
)

SessionMaker = Callable[[WorkloadSpec, Catalog, int], list[SessionTrace]]


def parse_sweep(text: str) -> tuple[str, list[float]]:
    """``"quantum_s=15,30,60"`` → ``("quantum_s", [15.0, 30.0, 60.0])``."""
    name, sep, values = text.partition("=")
    name = name.strip()
    if not sep or name not in SWEEP_PARAMS:
        raise ValueError(f"sweep must look like NAME=V1,V2,... with NAME one of: {SWEEP_PARAMS}")
    try:
        parsed = [float(v) for v in values.split(",") if v.strip()]
    except ValueError as exc:
        raise ValueError(f"sweep {name}: values must be numbers, got {values!r}") from exc
    if not parsed:
        raise ValueError(f"sweep {name}: no values")
    return name, parsed


def _varied(preset: Preset, catalog: Catalog, param: str, value: float) -> tuple[Preset, Catalog]:
    workload = preset.workload
    if param == "quantum_s":
        return replace(preset, quantum_s=value), catalog
    if param == "sessions":
        per_session = (workload.total_calls or 0) / workload.sessions
        total = round(per_session * value) if workload.total_calls else None
        workload = replace(workload, sessions=int(value), total_calls=total)
        return replace(preset, workload=workload), catalog
    if param == "mean_interarrival_s":
        return replace(preset, workload=replace(workload, mean_interarrival_s=value)), catalog
    if param == "zipf_s":
        return replace(preset, workload=replace(workload, zipf_s=value)), catalog
    varied = copy.copy(catalog)
    if param == "weight_bw_scale":
        server = catalog.server(preset.server)
        varied.servers = {
            **catalog.servers,
            server.name: replace(
                server,
                weight_wake_bytes_per_s_per_gpu=server.weight_wake_bytes_per_s_per_gpu * value,
                weight_sleep_bytes_per_s_per_gpu=server.weight_sleep_bytes_per_s_per_gpu * value,
            ),
        }
    else:
        profile = catalog.profile(preset.profile)
        if param == "compute_efficiency":
            profile = replace(profile, compute_efficiency=value)
        elif param == "memory_efficiency":
            profile = replace(profile, memory_efficiency=value)
        else:
            profile = replace(profile, step_overhead_s=value)
        varied.profiles = {**catalog.profiles, profile.name: profile}
    return preset, varied


def run_sweep(
    preset: Preset,
    catalog: Catalog,
    sweeps: Sequence[tuple[str, list[float]]],
    make_sessions: SessionMaker,
    seeds: Sequence[int] = (0,),
    on_call: OnCall | None = None,
) -> list[dict[str, Any]]:
    """One row per (parameter, value): the median over ``seeds`` of round / talaria /
    dedicated SCT percentiles and of the ratios (each ratio is taken per seed first)."""
    rows: list[dict[str, Any]] = []
    for param, values in sweeps:
        for value in values:
            varied_preset, varied_catalog = _varied(preset, catalog, param, value)
            per_seed = []
            for seed in seeds:
                sessions = make_sessions(varied_preset.workload, varied_catalog, seed)
                setup = varied_preset.experiment_setup(None, sessions, varied_catalog)
                doc = run_experiment(sessions, varied_catalog, setup, ["round", "talaria"], on_call)
                per_seed.append(_row(doc))
            row: dict[str, Any] = {"param": param, "value": value, "seeds": len(per_seed)}
            row.update({k: statistics.median(r[k] for r in per_seed) for k in per_seed[0]})
            rows.append(row)
    return rows


def _row(doc: dict[str, Any]) -> dict[str, float]:
    rnd, tal, ded = doc["policies"]["round"], doc["policies"]["talaria"], doc["dedicated"]
    return {
        "round_p50_sct_s": rnd["p50_sct_s"],
        "round_p95_sct_s": rnd["p95_sct_s"],
        "talaria_p50_sct_s": tal["p50_sct_s"],
        "talaria_p95_sct_s": tal["p95_sct_s"],
        "dedicated_p50_sct_s": ded["p50_sct_s"],
        "speedup_p50": tal["speedup_p50"],
        "speedup_p95": tal["speedup_p95"],
        "multiplexing_cost_p50": doc["multiplexing_cost_p50"],
        "oracle_ratio_p50": tal["oracle_ratio_p50"],
        "talaria_switches": tal["switches"],
        "round_switches": rnd["switches"],
        "calls": doc["calls"],
    }
