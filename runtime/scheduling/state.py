"""The state a node scheduler's parts share (``NodeState``): its engines and memory, the
waiting queues, the sessions, the soft reservations, and the current slot (``SlotState``),
with the record of every slot so far (``SlotRecord``).

A slot belongs to one model (``active``); the *resident set* (``resident``) is that model plus,
with ``co_residency``, the models serving beside it. Models in ``leaving`` have had their slot
closed and drain, admitting nothing; ``hold`` stops all admission while a transition waits for
HBM. A contended slot closes on its deadline: start + length (``SchedulerConfig.quantum_s``, or
the demand-sized length, ``slots.slot_length_s``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from talaria.core.clock import Clock
from talaria.core.types import CallRequest, CallResult, GenerationEvent
from talaria.runtime.engine import Engine
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import SchedulerFlags
from talaria.runtime.scheduling.holds import KvHolds
from talaria.runtime.scheduling.resources import NodeMemory
from talaria.runtime.scheduling.sessions import SessionBook
from talaria.runtime.scheduling.slots import CloseReason


@dataclass(eq=False)
class WaitingCall:
    """A queued call: its request, when it arrived, its result, and (streaming) its events."""

    request: CallRequest
    arrival_s: float
    result: asyncio.Future[CallResult]
    events: asyncio.Queue[GenerationEvent] | None = None
    serving: asyncio.Task[None] | None = None
    """The task generating it, once admitted."""


@dataclass
class SlotRecord:
    """One slot as it ran: its model, when it opened, how long its switch took, when and why it
    closed, and how many calls it admitted (``sp_admitted`` of them by the SP budget)."""

    model: str
    start_s: float
    switch_s: float
    end_s: float | None = None
    close: CloseReason | None = None
    admitted: int = 0
    sp_admitted: int = 0
    co_resident: tuple[str, ...] = ()
    """The other models resident and serving during this slot (``co_residency``)."""
    activated: tuple[str, ...] = ()
    """Models activated (woken) when this slot opened: its switch."""


@dataclass
class SlotState:
    """The current slot and the resident set (rules in the module docstring)."""

    length_s: float
    """The current slot's length (its deadline is ``start_s`` + this)."""
    start_s: float = 0.0
    active: str | None = None
    """The slot's model (None before the first slot and while it is switched out)."""
    resident: list[str] = field(default_factory=list)
    """Active engines, admitting calls (the slot's model and its co-residents)."""
    leaving: set[str] = field(default_factory=set)
    """Resident models draining after their slot closed, admitting nothing."""
    hold: bool = False
    """A transition waits for HBM: no model admits until it has room."""
    serving_since: dict[str, float] = field(default_factory=dict)
    """Per resident model: when its activation ended (it has served without a break since)."""
    records: list[SlotRecord] = field(default_factory=list)

    def deadline_s(self) -> float:
        """start + length: when a contended slot closes on its quantum."""
        return self.start_s + self.length_s

    def close(self, now_s: float, reason: CloseReason) -> None:
        """Record the current slot's end."""
        self.records[-1].end_s, self.records[-1].close = now_s, reason

    def open(
        self,
        plan: list[str],
        now_s: float,
        length_s: float,
        switch_s: float,
        activated: tuple[str, ...],
    ) -> None:
        """A new slot for ``plan[0]`` (its model) with the current residents beside it; an
        open previous slot ends when this one's switch began."""
        if self.records and self.records[-1].end_s is None:
            self.records[-1].end_s = now_s - switch_s
        self.active = plan[0]
        self.start_s = now_s
        self.length_s = length_s
        others = tuple(m for m in self.resident if m != plan[0])
        self.records.append(
            SlotRecord(plan[0], now_s - switch_s, switch_s, co_resident=others, activated=activated)
        )


@dataclass(eq=False)
class NodeState:
    """Everything one node's scheduler keeps, shared by its parts (``intake.Intake``,
    ``loop.SlotLoop``, ``node_status.StatusReader``)."""

    name: str
    engines: dict[str, Engine]
    order: list[str]
    """The hosted models in configured order (the round-robin order)."""
    memory: NodeMemory
    clock: Clock
    flags: SchedulerFlags
    config: SchedulerConfig
    waiting: dict[str, deque[WaitingCall]]
    """One FIFO of waiting calls per model."""
    sessions: SessionBook
    holds: KvHolds
    slot: SlotState
    wake: asyncio.Event
    """Set whenever the loop should look again (an arrival, a finish, a release)."""
    call_done: asyncio.Event
    """Set whenever a call ends (a transition waiting for HBM looks again)."""

    def waiting_counts(self) -> dict[str, int]:
        """Per model: calls queued."""
        return {m: len(q) for m, q in self.waiting.items()}

    def stale_window_s(self) -> float:
        """stale_after_quanta × Q: how long after its last call a session still counts as in a
        tool gap."""
        return self.config.stale_after_quanta * self.config.quantum_s
