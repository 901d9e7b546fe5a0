"""What the parts of one node's scheduler keep, and who owns each piece: the calls waiting
(``WaitingCall``), the current slot (``SlotState``) with the record of every slot so far
(``SlotRecord``), the wake-ups (``Signals``) and what every part reads and none changes
(``NodeContext``).

Each piece of node state has one owner, the only part that changes it; the others read it
through the owner's methods or a read-only view:

| state                  | owner: its only writer | the others read it through                  |
|------------------------|------------------------|---------------------------------------------|
| the model set: engines | ``NodeScheduler``      | ``NodeContext.engines``, ``.order``: read-only |
| the waiting queues     | ``Intake``             | ``Intake.waiting`` (read-only)              |
| the slot, a transition | ``SlotLoop``           | ``SlotLoop.slot`` (``SlotStateView``)       |
| the holds              | ``SlotLoop``           | ``SlotLoop.holds``                          |
| the sessions           | ``SessionLifecycle``   | ``SessionsView`` (loop, status)             |
| the wake-ups           | none: any part raises  | the loop; a wait for a call's end           |

The intake reads the slot and the holds through the ``AdmissionView`` the loop hands
each admission pass, and hands back what it admitted, which the loop records in the slot. A
change another part needs goes through the owner's method: the model set changes only in
``NodeScheduler.add_model`` / ``retire`` (which open and close the model's queue with
``Intake.open_queue`` / ``close_queue``); calls join and leave the queues through
``Intake.enqueue`` / ``withdraw`` and its admission pass; a retired model leaves the resident
set through ``SlotLoop.retire``, in the loop's order of events (once its calls are gone and no
transition runs); the session lifecycle makes and releases holds through ``SlotLoop.hold`` /
``release_hold``; the intake gets a call's session through the node's
callback (``SessionLifecycle.session_of``).

``NodeContext`` holds the rest: the name, clock and config, which never change, and
``NodeMemory`` (runtime/memory/resources.py), the HBM and host KV accounting the engines
share, changed only through its own methods.

A slot belongs to one model (``active``); the *resident set* (``resident``) is that model plus,
under a co-resident planner (policies/planner.py), the models serving beside it. Models in
``leaving`` have had their slot closed and drain, admitting nothing; ``hold`` stops all
admission while a transition waits for HBM. A contended slot closes on its deadline: start +
length (``SchedulerConfig.quantum_s``, or the demand-sized length, ``slots.slot_length_s``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from talaria.core.clock import Clock
from talaria.core.types import CallRequest, CallResult, GenerationEvent
from talaria.runtime.memory.resources import NodeMemory
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.driven import DrivenEngine
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
    estimate_s: float = 0.0
    """Its service as estimated when it was admitted (the fair order's charge, fairness.py)."""


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
    """The other models resident and serving during this slot (a co-resident planner)."""
    activated: tuple[str, ...] = ()
    """Models activated (woken) when this slot opened: its switch."""


@dataclass
class SlotState:
    """The current slot and the resident set (rules in the module docstring); the slot loop
    (loop.py) owns it and alone changes it."""

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


class SlotStateView(Protocol):
    """The current slot as the parts other than the slot loop read it (``SlotState``
    implements it; the loop alone changes it)."""

    @property
    def active(self) -> str | None:
        """The slot's model (``SlotState.active``)."""
        ...

    @property
    def resident(self) -> Sequence[str]:
        """The resident set (``SlotState.resident``)."""
        ...

    @property
    def records(self) -> Sequence[SlotRecord]:
        """Every slot so far, oldest first."""
        ...

    def deadline_s(self) -> float:
        """start + length: when a contended slot closes on its quantum."""
        ...


class Signals:
    """The node's two wake-ups. Any part may raise them; they carry no state (each part reads
    what changed from its owner)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._wake = asyncio.Event()
        self._call_done = asyncio.Event()

    def poke(self) -> None:
        """The slot loop should look again (an arrival, a release, a model added or gone)."""
        self._wake.set()

    def call_ended(self) -> None:
        """A call ended: whoever waits for one (``next_call_end``) looks again, and so does
        the slot loop."""
        self._call_done.set()
        self._wake.set()

    def clear_poke(self) -> None:
        """The slot loop starts a pass: pokes from now on are new."""
        self._wake.clear()

    async def next_poke(self, timeout_s: float | None) -> None:
        """Wait for a poke since the last ``clear_poke`` (or ``timeout_s`` clock seconds)."""
        await self._clock.wait_event(self._wake, timeout_s)

    async def next_call_end(self, timeout_s: float | None) -> None:
        """Wait for the next call to end (or ``timeout_s`` clock seconds)."""
        self._call_done.clear()
        await self._clock.wait_event(self._call_done, timeout_s)


@dataclass(frozen=True, eq=False)
class NodeContext:
    """What every part of one node's scheduler reads and none of them changes (the module
    docstring says who owns the rest)."""

    name: str
    clock: Clock
    config: SchedulerConfig
    memory: NodeMemory
    """The HBM and host KV accounting (runtime/memory/), changed only through its own methods."""
    engines: Mapping[str, DrivenEngine]
    """The hosted models' engines in configured order, each as the node drives it (driven.py):
    a read-only view of the model set, which ``NodeScheduler`` alone changes (``add_model``,
    ``retire``)."""
    signals: Signals

    @property
    def order(self) -> tuple[str, ...]:
        """The hosted models in configured order (the round-robin order)."""
        return tuple(self.engines)

    def stale_window_s(self) -> float:
        """stale_after_quanta × Q: how long after its last call a session still counts as in a
        tool gap."""
        return self.config.stale_after_quanta * self.config.quantum_s
