"""What the placement loop (proxy/placement/loop.py) needs of a runtime it moves models on,
and what it records of each move."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from talaria.core.status import InstanceStatus


class PlacementTarget(Protocol):
    """A runtime client whose models the loop changes (proxy/runtimes/http.py)."""

    name: str
    weight_budget_bytes: float
    quantum_s: float | None

    @property
    def models(self) -> tuple[str, ...]: ...

    @property
    def draining_models(self) -> frozenset[str]: ...

    async def status(self) -> InstanceStatus: ...

    async def demand(self, window_s: float) -> Mapping[str, Any]: ...

    async def add_model(self, entry: Mapping[str, Any]) -> None: ...

    async def drain_model(self, name: str) -> None: ...

    async def remove_model(self, name: str) -> None: ...


@dataclass(frozen=True)
class LiveMove:
    """One move the loop made: when (clock seconds), what, why, and how it ended (``ok``,
    ``failed: ...``, or ``running``) after how many seconds."""

    at_s: float
    kind: str
    model: str
    runtime: str
    reason: str
    outcome: str = "running"
    seconds: float = 0.0
