"""Named replay setups: the workload, the server, how many nodes, and the slot quantum."""

from __future__ import annotations

from dataclasses import dataclass, replace

from talaria.sim.workload import PAPER_WORKLOAD, WorkloadSpec


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    workload: WorkloadSpec
    server: str = "h200x8"
    profile: str = "default"
    quantum_s: float = 60.0
    """Slot quantum of a contended slot. The paper does not state its round scheduler's slot
    length; 60 s is our default (about 7× the ~8.6 s sleep+wake switch of the paper trio, so
    switching costs at most ~13% of a contended round) and ``--sweep quantum_s=...`` varies it."""


PRESETS: dict[str, Preset] = {
    "paper": Preset(
        "paper",
        "the paper's setup: one 8×H200 node, three 100B+ models whose weights do not all fit "
        "(GLM-4.5-FP8, Qwen3-235B-A22B-BF16, Qwen3-Coder-480B-FP8), 30 sessions, 960 calls, "
        "Poisson arrivals every 10 s on average, Zipf(1) model popularity",
        PAPER_WORKLOAD,
    ),
    "small": Preset(
        "small",
        "a quick check: the paper's three models, 6 sessions of ~8 calls",
        replace(PAPER_WORKLOAD, sessions=6, total_calls=48),
    ),
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError as exc:
        raise ValueError(f"unknown preset {name!r}; choose from: {', '.join(PRESETS)}") from exc
