"""Queue orders: in which order a model's waiting calls are considered for admission, and what
else the order decides about classes (policies/__init__.py lists the kinds).

- ``ArrivalOrder``: first come, first considered; classes and tenants play no part.
- ``FairOrder``: fairness.py's rules: class (with promotion after ``starvation_s``), tenant
  shares of the node's service, least attained service per session; the demand for slots is
  weighed by the tenants' shares (slots.py ``shared_work``); a slot closes for a higher class
  waiting outside it (slots.py ``outranked``); a lower class's hold never blocks a
  higher class's call, nor may a lower-class call slow the higher classes' decode steps past
  ``class_slowdown`` (fairness.py rule 4); idle KV is evicted lowest class first.

An order is chosen once per node (policies/compose.py ``QUEUE_ORDERS``); adding one is a
subclass of ``QueueOrder`` and a line in that table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import ClassVar

from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.driven import DrivenEngine
from talaria.runtime.scheduling.events import SessionEvents
from talaria.runtime.scheduling.fairness import ServiceAccounts, fair_order, lower_class_fits
from talaria.runtime.scheduling.sessions import SessionsView
from talaria.runtime.scheduling.slots import (
    Demand,
    DemandPolicy,
    best_class,
    outranked,
    shared_work,
)
from talaria.runtime.scheduling.state import WaitingCall

Work = dict[str, dict[str, int]]
"""tenant → model → calls waiting and sessions expected back (slots.py ``shared_work``)."""


class QueueOrder(SessionEvents):
    """The order of a model's waiting calls, and the class rules that go with it. ``order``
    is required; every other hook defaults to "classes and tenants play no part"."""

    name: ClassVar[str]
    evicts_by_class: ClassVar[bool] = False
    """Idle KV is evicted lowest class first (the engines' eviction order, set when they are
    built), else least recently used."""

    def order(self, queue: Sequence[WaitingCall], now_s: float) -> Iterator[WaitingCall]:
        """``queue`` in the order its calls are considered (a generator may read the accounts
        again after each call it yields: the caller admits meanwhile)."""
        raise NotImplementedError

    def weighed_work(
        self,
        work: Work,
        weights: dict[str, float],
        waiting: Mapping[str, Sequence[WaitingCall]],
    ) -> dict[str, float] | None:
        """Per model, the demand for slots weighed by the tenants' shares, given the sessions
        expected back (``work``, ``weights``: tenant → weight); None: the plain count."""
        return None

    def first_choices(
        self, eligible: dict[str, Demand], best_waiting: Callable[[], Mapping[str, int]]
    ) -> dict[str, Demand]:
        """The models the demand planner may give the next slot to, of ``eligible`` (those
        with calls waiting); ``best_waiting``: per model, the best class waiting."""
        return eligible

    def closes_slot(
        self, classes: Callable[[], tuple[int | None, int | None]], elapsed_s: float
    ) -> bool:
        """Whether the slot closes for a higher class now; ``classes``: the best class waiting
        outside the resident set and the best it serves; ``elapsed_s``: the slot's age."""
        return False

    def counted_holds(self, rank: int, sessions: SessionsView) -> Callable[[str], bool] | None:
        """Which sessions' holds count against a call of class ``rank`` (a
        predicate of the session key); None: all of them."""
        return None

    def may_join(
        self,
        engine: DrivenEngine,
        waiting: WaitingCall,
        rank: int,
        running: Mapping[WaitingCall, int],
        sessions: SessionsView,
        expected_back: Callable[[], list[int]],
    ) -> bool:
        """Whether the call (served in class ``rank``) may join its model's running batch
        (``running``: each running call's own class); ``expected_back()``: the context tokens
        of its model's sessions of a higher class than ``rank`` expected back while the call
        would run."""
        return True


class ArrivalOrder(QueueOrder):
    """First come, first considered."""

    name = "arrival"

    def order(self, queue: Sequence[WaitingCall], now_s: float) -> Iterator[WaitingCall]:
        return iter(list(queue))


class FairOrder(QueueOrder):
    """Class, tenant shares, least attained service (fairness.py; the module docstring)."""

    name = "fair"
    evicts_by_class = True

    def __init__(self, accounts: ServiceAccounts, config: SchedulerConfig) -> None:
        self.accounts = accounts
        self.starvation_s = config.starvation_quanta * config.quantum_s
        self.min_slot_s = DemandPolicy(config.quantum_s).min_factor * config.quantum_s
        """A slot closes for a higher class only after this much (half a quantum)."""
        self.class_slowdown = config.class_slowdown

    def order(self, queue: Sequence[WaitingCall], now_s: float) -> Iterator[WaitingCall]:
        return fair_order(list(queue), self.accounts, now_s, self.starvation_s)

    def weighed_work(
        self,
        work: Work,
        weights: dict[str, float],
        waiting: Mapping[str, Sequence[WaitingCall]],
    ) -> dict[str, float] | None:
        for model, queue in waiting.items():
            for call in queue:
                per_model = work.setdefault(call.request.tenant, {})
                per_model[model] = per_model.get(model, 0) + 1
                weights[call.request.tenant] = call.request.tenant_weight
        return shared_work(work, weights)

    def first_choices(
        self, eligible: dict[str, Demand], best_waiting: Callable[[], Mapping[str, int]]
    ) -> dict[str, Demand]:
        classes = best_waiting()  # the best class waiting first (fairness.py rule 1)
        best = best_class([classes[m] for m in eligible if m in classes])
        return {m: d for m, d in eligible.items() if classes.get(m) == best}

    def closes_slot(
        self, classes: Callable[[], tuple[int | None, int | None]], elapsed_s: float
    ) -> bool:
        outside, serving = classes()
        return outranked(outside, serving, elapsed_s, self.min_slot_s)

    def counted_holds(self, rank: int, sessions: SessionsView) -> Callable[[str], bool] | None:
        def counts(session_key: str) -> bool:
            session = sessions.get(session_key)
            return session is None or session.rank <= rank

        return counts

    def may_join(
        self,
        engine: DrivenEngine,
        waiting: WaitingCall,
        rank: int,
        running: Mapping[WaitingCall, int],
        sessions: SessionsView,
        expected_back: Callable[[], list[int]],
    ) -> bool:
        """Fairness rule 4: the call may join the running batch only without slowing the
        higher classes' calls (running, and their sessions expected back while it runs) past
        ``class_slowdown`` per decode step."""
        if sessions.classes_seen() < 2:
            return True
        higher = [w.request.prompt_tokens for w, own in running.items() if own < rank]
        higher += expected_back()
        if not higher:
            return True
        lower = [w.request.prompt_tokens for w, own in running.items() if own >= rank]
        batch = [*higher, *lower, waiting.request.prompt_tokens]
        higher_step = engine.decode_step_s(len(higher), sum(higher))
        with_it = engine.decode_step_s(len(batch), sum(batch))
        return lower_class_fits(with_it, higher_step, self.class_slowdown)
