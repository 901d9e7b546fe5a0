"""Slot planners: which model gets the next slot, which models are resident beside it, and how
long the slot lasts (policies/__init__.py lists the kinds; the rules are slots.py's pure
functions).

- ``RoundRobinPlanner``: the next model in round-robin order with a call waiting outside the
  resident set (slots.py ``next_model``); every slot is one quantum Q.
- ``DemandPlanner``: the model with the highest demand score, a starving one first (slots.py
  ``next_model_by_demand``; the queue order may narrow the choice to the best class waiting);
  a slot of Q × clamp(n × share, ½, 2) (``slot_length_s``).
- ``CoResidentPlanner(inner)``: ``inner``'s model first, then every model whose weights fit
  beside it (slots.py ``resident_set``); only the models that do not fit are switched.
- ``KeepAlivePlanner``: a serverless platform's request-level instances (flags.py
  ``serverless_instances``): the model whose oldest waiting call has waited longest; its slot
  has no quantum and closes only once the model has had no call running or admissible for
  ``keep_alive_s`` (the loop keeps the slot that long, runtime/scheduling/loop.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from talaria.runtime.scheduling.driven import DrivenEngine
from talaria.runtime.scheduling.events import SessionEvents
from talaria.runtime.scheduling.policies.queue import QueueOrder
from talaria.runtime.scheduling.slots import (
    Demand,
    DemandPolicy,
    next_model,
    next_model_by_demand,
    resident_set,
    slot_length_s,
)


@dataclass
class PlanView:
    """What a planner reads to plan the next resident set (the slot loop builds it per plan)."""

    order: Sequence[str]
    """The hosted models in configured order (the round-robin order)."""
    active: str | None
    """The current slot's model."""
    resident: Sequence[str]
    outside: Mapping[str, int]
    """Calls waiting per model outside the resident set (at least one model has some)."""
    demand_of: Callable[[], Mapping[str, Demand]]
    """Per model, its demand now (computed once, on first use)."""
    best_waiting: Callable[[], Mapping[str, int]]
    """Per model with calls waiting, the best class among them."""
    engines: Mapping[str, DrivenEngine]
    capacity_bytes: float
    """The node's HBM."""
    _demands: Mapping[str, Demand] | None = field(default=None, init=False)

    def demands(self) -> Mapping[str, Demand]:
        """``demand_of()``, computed once per view."""
        if self._demands is None:
            self._demands = self.demand_of()
        return self._demands


SERVERLESS_KEEP_ALIVE_S = 60.0
"""A serverless instance's fixed keep-alive after its last call: Knative's default stable
window (docs/sources.md §16)."""


class SlotPlanner(SessionEvents):
    """Plans the next resident set; ``first`` is required."""

    name: ClassVar[str]
    keep_alive_s: ClassVar[float] = 0.0
    """A contended slot stays open this long after its models' last call (0: it closes once
    they are idle)."""

    def __init__(self, quantum_s: float, queue: QueueOrder) -> None:
        self.quantum_s = quantum_s
        self.queue = queue

    def first(self, view: PlanView) -> str:
        """The model whose slot comes next (it has a call waiting outside the resident set)."""
        raise NotImplementedError

    def plan(self, view: PlanView) -> list[str]:
        """The next resident set, the slot's model first."""
        return [self.first(view)]

    def slot_length_s(self, model: str, demand_of: Callable[[], Mapping[str, Demand]]) -> float:
        """How long ``model``'s slot lasts once contended."""
        return self.quantum_s


class RoundRobinPlanner(SlotPlanner):
    """Round-robin turns, one quantum each."""

    name = "round-robin"

    def first(self, view: PlanView) -> str:
        model = next_model(view.order, view.active, view.outside)
        assert model is not None, "a plan is asked for only with calls waiting outside"
        return model


class DemandPlanner(SlotPlanner):
    """The highest demand first (a starving model before all), slots sized by demand."""

    name = "demand"

    def __init__(self, quantum_s: float, queue: QueueOrder) -> None:
        super().__init__(quantum_s, queue)
        self.policy = DemandPolicy(quantum_s)

    def first(self, view: PlanView) -> str:
        eligible = {m: d for m, d in view.demands().items() if d.waiting > 0}
        eligible = self.queue.first_choices(eligible, view.best_waiting)
        model = next_model_by_demand(view.order, view.active, eligible, self.policy)
        assert model is not None, "a plan is asked for only with calls waiting outside"
        return model

    def slot_length_s(self, model: str, demand_of: Callable[[], Mapping[str, Demand]]) -> float:
        return slot_length_s(model, demand_of(), self.policy)


class CoResidentPlanner(SlotPlanner):
    """``inner``'s model first, then the models whose weights fit beside it."""

    def __init__(self, inner: SlotPlanner) -> None:
        super().__init__(inner.quantum_s, inner.queue)
        self.inner = inner
        self.name = f"{inner.name}+co-residency"  # type: ignore[misc]

    def first(self, view: PlanView) -> str:
        return self.inner.first(view)

    def plan(self, view: PlanView) -> list[str]:
        engines = view.engines
        return resident_set(
            self.first(view),
            view.resident,
            view.demands(),
            {m: e.weight_bytes for m, e in engines.items()},
            {m: e.kv_floor_bytes() for m, e in engines.items()},
            view.capacity_bytes,
            self.quantum_s,
        )

    def slot_length_s(self, model: str, demand_of: Callable[[], Mapping[str, Demand]]) -> float:
        return self.inner.slot_length_s(model, demand_of)


class KeepAlivePlanner(SlotPlanner):
    """Request-level instances (module docstring): the oldest waiting call's model first, a
    slot without a quantum, kept ``SERVERLESS_KEEP_ALIVE_S`` after the last call."""

    name = "keep-alive"
    keep_alive_s = SERVERLESS_KEEP_ALIVE_S

    def first(self, view: PlanView) -> str:
        waiting = {m: d for m, d in view.demands().items() if view.outside.get(m, 0) > 0}
        assert waiting, "a plan is asked for only with calls waiting outside"
        rank = {m: i for i, m in enumerate(view.order)}
        return max(waiting, key=lambda m: (waiting[m].oldest_wait_s, -rank.get(m, 0)))

    def slot_length_s(self, model: str, demand_of: Callable[[], Mapping[str, Demand]]) -> float:
        return math.inf
