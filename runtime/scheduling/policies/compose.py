"""The table of compositions: each named policy (flags.py's names: ``round``, ``talaria``,
``talaria-learned``, ``+flag``, ``-flag``) is one choice per kind, and the objects a node is
built with.

| flag on            | kind      | choice                                   | off               |
|--------------------|-----------|------------------------------------------|-------------------|
| ``sp_admission``   | admission | ``session-prefill``                      | ``slot-batch``    |
| ``host_kv``        | switch    | KV kept on host at a switch              | dropped           |
| ``d2d_staging``    | switch    | weights staged during the slot           | none              |
| ``soft_reservations`` | holds  | ``mean-gap`` (``learned-gap`` with ``learned_gaps``) | ``none`` |
| ``demand_slots``   | planner   | ``demand``                               | ``round-robin``   |
| ``co_residency``   | planner   | ``<planner>+co-residency``               | the planner alone |
| ``fair_queue``     | queue     | ``fair``                                 | ``arrival``       |
| ``serverless_instances`` | planner | ``keep-alive``                     | as above          |
| ``serverless_instances`` | admission | every call of a resident model   | as above          |

This module alone reads the flags (``PolicyChoice.of``); the node reads its objects. A new
queue order, planner or hold policy is a class in its kind's module and a line in its table
below; a ``PolicyChoice`` names it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.events import SessionEvents
from talaria.runtime.scheduling.fairness import ServiceAccounts
from talaria.runtime.scheduling.flags import SchedulerFlags
from talaria.runtime.scheduling.policies.holding import (
    HoldPolicy,
    LearnedGapHolds,
    MeanGapHolds,
    NoHolds,
)
from talaria.runtime.scheduling.policies.planner import (
    CoResidentPlanner,
    DemandPlanner,
    KeepAlivePlanner,
    RoundRobinPlanner,
    SlotPlanner,
)
from talaria.runtime.scheduling.policies.queue import ArrivalOrder, FairOrder, QueueOrder
from talaria.runtime.scheduling.policies.switching import AdmissionRule, SwitchPolicy

QUEUE_ORDERS: dict[str, Callable[[ServiceAccounts, SchedulerConfig], QueueOrder]] = {
    "arrival": lambda _accounts, _config: ArrivalOrder(),
    "fair": FairOrder,
}
"""Queue order name → its constructor (the node's service accounts, its config)."""
PLANNERS: dict[str, Callable[[float, QueueOrder], SlotPlanner]] = {
    "round-robin": RoundRobinPlanner,
    "demand": DemandPlanner,
    "round-robin+co-residency": lambda q, queue: CoResidentPlanner(RoundRobinPlanner(q, queue)),
    "demand+co-residency": lambda q, queue: CoResidentPlanner(DemandPlanner(q, queue)),
    "keep-alive": KeepAlivePlanner,
}
"""Slot planner name → its constructor (the quantum, the node's queue order)."""
HOLD_POLICIES: dict[str, Callable[[float], HoldPolicy]] = {
    "none": NoHolds,
    "mean-gap": MeanGapHolds,
    "learned-gap": LearnedGapHolds,
}
"""Hold policy name → its constructor (the gap quantile)."""
EVICTS_BY_CLASS = frozenset({"fair"})
"""Queue orders under which idle KV is evicted lowest class first (the engines are built
with it, before the node's objects)."""


@dataclass(frozen=True)
class PolicyChoice:
    """One choice per kind, by name (the tables above)."""

    queue: str = "arrival"
    planner: str = "round-robin"
    holds: str = "none"
    session_prefill: bool = False
    """Admission: ``session-prefill`` (True) or ``slot-batch``."""
    kv_on_host: bool = False
    """Switch: the outgoing model's session KV moves to host DRAM (else it is dropped)."""
    stage_weights: bool = False
    """Switch: the next model's weights are staged during the slot."""
    instances: bool = False
    """Admission: every call of a resident model enters (request-level instances)."""

    def __post_init__(self) -> None:
        for kind, name, table in (
            ("queue order", self.queue, QUEUE_ORDERS),
            ("slot planner", self.planner, PLANNERS),
            ("hold policy", self.holds, HOLD_POLICIES),
        ):
            if name not in table:
                raise ValueError(f"unknown {kind} {name!r}; choose from: {', '.join(table)}")

    @classmethod
    def of(cls, flags: SchedulerFlags) -> PolicyChoice:
        """The composition of a named policy's flags (the module docstring's table)."""
        planner = "demand" if flags.demand_slots else "round-robin"
        if flags.serverless_instances:
            planner = "keep-alive"
        holds = "none"
        if flags.soft_reservations:
            holds = "learned-gap" if flags.learned_gaps else "mean-gap"
        return cls(
            queue="fair" if flags.fair_queue else "arrival",
            planner=f"{planner}+co-residency" if flags.co_residency else planner,
            holds=holds,
            session_prefill=flags.sp_admission,
            kv_on_host=flags.host_kv,
            stage_weights=flags.d2d_staging,
            instances=flags.serverless_instances,
        )

    @property
    def evicts_by_class(self) -> bool:
        """The engines evict idle KV lowest class first (else least recently used)."""
        return self.queue in EVICTS_BY_CLASS


@dataclass(frozen=True)
class NodePolicies:
    """One node's policy objects, built once (``build``)."""

    queue: QueueOrder
    planner: SlotPlanner
    holds: HoldPolicy
    admission: AdmissionRule
    switch: SwitchPolicy

    @classmethod
    def build(
        cls, choice: PolicyChoice, accounts: ServiceAccounts, config: SchedulerConfig
    ) -> NodePolicies:
        """The objects ``choice`` names, for a node with these accounts and config."""
        queue = QUEUE_ORDERS[choice.queue](accounts, config)
        return cls(
            queue=queue,
            planner=PLANNERS[choice.planner](config.quantum_s, queue),
            holds=HOLD_POLICIES[choice.holds](config.gap_quantile),
            admission=AdmissionRule(choice.session_prefill, choice.instances),
            switch=SwitchPolicy(choice.kv_on_host, choice.stage_weights),
        )

    def listeners(self) -> tuple[SessionEvents, ...]:
        """Every object, to hear the node's session events."""
        return (self.queue, self.planner, self.holds, self.admission, self.switch)
