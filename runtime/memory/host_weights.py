"""Which models' weights a node keeps pinned in host DRAM, by expected demand (issue 48).

A node hosting more models than its host DRAM's weight budget holds (runtime/memory/sizing.py
``pinned_weight_budget_bytes``) keeps pinned copies of some and reads the others from its
local NVMe (core/weight_tiers.py): a model without a copy pays the NVMe read on each wake,
and sleeps at vLLM's level 2 (weights discarded, nothing copied back).

Expected demand of model m at time t: its calls' arrivals, each weighing ``2^{-(t − a)/h}``
with ``h`` = ``DEMAND_HALF_LIFE_S`` (a decayed count: recent calls weigh most).

When a model without a copy goes to sleep (``keep``), it gets one if the budget and the free
host KV tier have the room once copies of models with less expected demand than its own are
dropped (least first); otherwise it stays on NVMe. A dropped copy costs nothing (the weights
are on NVMe too); a kept one costs the sleep's copy to host.

Every model starts with a copy while the budget lasts (in the node's order), so a node whose
models all fit (every preset before the market ones) behaves as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

DEMAND_HALF_LIFE_S = 600.0
"""How fast a call's weight in expected demand halves: the market's window, over which a
model's rate is redrawn (docs/sources.md §15; our choice)."""


class HostWeights:
    """The node's pinned host weight copies (module docstring): ``held`` (model → bytes) and
    the models whose weights are only on NVMe (``on_nvme``), within ``budget_bytes``."""

    def __init__(self, budget_bytes: float = math.inf) -> None:
        self.budget_bytes = budget_bytes
        self.held: dict[str, float] = {}
        self.on_nvme: dict[str, float] = {}
        self._demand: dict[str, tuple[float, float]] = {}

    def start(self, weight_bytes: Mapping[str, float]) -> float:
        """Give each model a copy, in order, while the budget lasts; the bytes held."""
        used = 0.0
        for model, nbytes in weight_bytes.items():
            if used + nbytes <= self.budget_bytes:
                self.held[model] = nbytes
                used += nbytes
            else:
                self.on_nvme[model] = nbytes
        return used

    def has_copy(self, model: str) -> bool:
        """A pinned host copy of the model's weights is kept (a model it was never told of,
        one placed while the node runs, has one: its placement checked the budget)."""
        return model not in self.on_nvme

    def observe(self, model: str, now: float) -> None:
        """A call of ``model`` arrived at ``now``."""
        self._demand[model] = (self.expected(model, now) + 1.0, now)

    def expected(self, model: str, now: float) -> float:
        """Its expected demand at ``now`` (module docstring)."""
        score, at = self._demand.get(model, (0.0, now))
        decay: float = 2.0 ** (-(now - at) / DEMAND_HALF_LIFE_S)
        return score * decay

    def keep(self, model: str, now: float, host_free_bytes: float) -> float | None:
        """Try to give ``model`` (on NVMe) a copy (module docstring): the host KV tier's change
        in bytes (negative: it shrinks) when it gets one, None when it stays on NVMe."""
        nbytes = self.on_nvme[model]
        mine = self.expected(model, now)
        lesser = sorted(
            (m for m in self.held if self.expected(m, now) < mine),
            key=lambda m: (self.expected(m, now), m),
        )
        used = sum(self.held.values())
        drop: list[str] = []
        while lesser and (
            used + nbytes > self.budget_bytes or nbytes - _freed(self, drop) > host_free_bytes
        ):
            drop.append(lesser.pop(0))
            used -= self.held[drop[-1]]
        freed = _freed(self, drop)
        if used + nbytes > self.budget_bytes or nbytes - freed > host_free_bytes:
            return None
        for m in drop:
            self.on_nvme[m] = self.held.pop(m)
        self.held[model] = self.on_nvme.pop(model)
        return freed - nbytes

    def forget(self, model: str) -> float:
        """``model`` left the node: the bytes of its copy (0 if none) go back to the tier."""
        self.on_nvme.pop(model, None)
        self._demand.pop(model, None)
        return self.held.pop(model, 0.0)


def _freed(weights: HostWeights, drop: list[str]) -> float:
    return sum(weights.held[m] for m in drop)
