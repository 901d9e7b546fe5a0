"""The fair queue's rule 5 as an engine applies it to whole calls: which running calls are
held for a higher class. The simulated engine leaves a held call out of its steps
(runtime/engines/sim_steps.py); vLLM's scheduler steps every running request, so a held call is
aborted and resubmitted when released (runtime/engines/vllm/generate.py; prompt + the output so
far, which vLLM's prefix cache finds again).

``ClassHolds`` keeps the engine's running calls in admission order, each with its class, its
context tokens and how often it has been held, and decides which are held with the pure rule
(runtime/engine.py ``class_steps``): the
best class's calls run; each other call runs only while the engine's decode step with it stays
≤ ``class_slowdown`` × the best class's alone (``step_s``: the engine's own cost model); a call
held ``preempt_limit`` times runs from then on. The decision is taken again whenever a call
enters or leaves (not at every iteration: a call's context grows meanwhile, and a decision
taken at whatever iteration an engine's loop is woken would depend on its wake-ups), so a held
call is released when the higher-class calls that held it have left, or room opens.

Without a rule (one class, ``-fair_queue``, ``preempt_limit = 0``) nothing is ever held.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from talaria.runtime.engine import ClassStepRule, class_steps


@dataclass(eq=False)
class Ticket:
    """One running call, as the holds see it."""

    rank: int
    """Its class (``Priority.rank``: 0 interactive, 1 standard, 2 batch)."""
    context_tokens: int
    """Prompt + output so far (the caller keeps it current)."""
    preempted: int = 0
    """Times it has been held."""
    released: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while it may run; cleared while held."""
    pausable: bool = True
    """Whether it can be held now; one that cannot (a chat call streaming what cannot be
    continued from its text) counts as past its preemption limit: it runs."""

    def __post_init__(self) -> None:
        self.released.set()

    @property
    def held(self) -> bool:
        """Whether the call must pause now."""
        return not self.released.is_set()


class ClassHolds:
    """Which of an engine's running calls are held for a higher class (the module docstring).
    ``step_s(batch, context_tokens)``: the engine's decode step estimate."""

    def __init__(self, step_s: Callable[[int, int], float]) -> None:
        self._step_s = step_s
        self.rule: ClassStepRule | None = None
        self.tickets: list[Ticket] = []
        """The running calls, in admission order."""
        self.preemptions = 0
        """Times a running call has been held."""

    def enter(self, rank: int, context_tokens: int) -> Ticket:
        """A call starts running: its ticket (maybe held at once, if a higher class runs)."""
        ticket = Ticket(rank, context_tokens)
        self.tickets.append(ticket)
        self.decide()
        return ticket

    def leave(self, ticket: Ticket) -> None:
        """A call ended (finished, failed or cancelled): the others may run again."""
        if ticket in self.tickets:
            self.tickets.remove(ticket)
            ticket.released.set()
            self.decide()

    def decide(self) -> None:
        """Hold or release each running call by ``class_steps``; a newly held call counts a
        preemption."""
        rule = self.rule
        if rule is None:
            running = list(self.tickets)
        else:
            running = class_steps(
                self.tickets,
                rank=lambda t: t.rank,
                preempted=lambda t: t.preempted if t.pausable else rule.preempt_limit,
                step_s=lambda ts: self._step_s(len(ts), sum(t.context_tokens for t in ts)),
                class_slowdown=rule.class_slowdown,
                preempt_limit=rule.preempt_limit,
            )
        chosen = set(map(id, running))
        for ticket in self.tickets:
            if id(ticket) in chosen:
                ticket.released.set()
            elif not ticket.held:
                ticket.released.clear()
                ticket.preempted += 1
                self.preemptions += 1
