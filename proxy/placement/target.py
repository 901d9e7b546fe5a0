"""What the placement loop (proxy/placement/loop.py) and its moves (moves.py) need of a runtime
they move models on (``target_of`` finds it in the pool), and what they record of each move."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

from talaria.core.status import InstanceStatus
from talaria.proxy.runtimes.pool import RuntimePool


class PlacementTarget(Protocol):
    """A runtime client whose models the loop changes (proxy/runtimes/http.py)."""

    name: str

    @property
    def weight_budget_bytes(self) -> float: ...

    @property
    def quantum_s(self) -> float | None: ...

    @property
    def server(self) -> str | None:
        """The runtime's hardware (a catalog server), as its status says; None: not said."""
        ...

    @property
    def gpus(self) -> int | None:
        """The GPUs of its group (core/groups.py), as its status says; None: not said."""
        ...

    @property
    def models(self) -> tuple[str, ...]: ...

    @property
    def draining_models(self) -> frozenset[str]: ...

    async def status(self) -> InstanceStatus: ...

    async def demand(self, window_s: float) -> Mapping[str, Any]: ...

    async def add_model(self, entry: Mapping[str, Any]) -> None: ...

    async def drain_model(self, name: str) -> None: ...

    async def remove_model(self, name: str) -> None: ...


def target_of(pool: RuntimePool, name: str) -> PlacementTarget:
    """The pool's runtime ``name`` as a placement target (the loop checks at construction that
    every runtime of its pool is one)."""
    return cast(PlacementTarget, pool[name])


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


PlacementTime = Callable[[float, str], float | None]
"""(weight bytes, server) → seconds to place a model of those weights from storage on a runtime
of that server (core/server_spec.py ``ServerSpec.placement_s``); None: not known."""

GroupFloor = Callable[[str, str], int | None]
"""(model, server) → the fewest GPUs of a group of that server that hold the model
(core/groups.py ``smallest_group``); None: not known (no constraint)."""


def too_small(target: PlacementTarget, models: Iterable[str], floor: GroupFloor) -> frozenset[str]:
    """Of ``models``, those the target's GPU group cannot hold (the controller's
    ``NodeView.too_small``); none when the runtime does not say its server and group."""
    if target.server is None or target.gpus is None:
        return frozenset()
    return frozenset(
        m for m in models if (need := floor(m, target.server)) is not None and need > target.gpus
    )
