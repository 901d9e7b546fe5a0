"""Which waiting call of a model goes next in the fair queue order (policies/queue.py
``FairOrder``): a pure policy over the waiting calls, the clock and the node's service accounts.
The other order is arrival order (``ArrivalOrder``).

The order, outermost rule first:

1. **Class** (``Priority.rank``): interactive, then standard, then batch. A call that has
   waited ``starvation_s`` is promoted one class, and one more after twice that: no call
   waits more than ``2 · starvation_s`` behind the higher classes' arrivals.
2. **Tenant** — start-time fair queueing over service seconds. Each tenant ``t`` has a virtual
   time ``V_t``. Admitting a call of estimated service ``e`` (its prefill and expected decode
   on the engine, ``Engine.estimate_service_s``) charges ``V_t += e / w_t`` (``w_t``: the
   tenant's weight); its finish charges the difference ``(measured − e) / w_t`` (measured:
   the engine's admitted-to-finished seconds), so a tenant with long prompts pays for them.
   Among the tenants with a call waiting, the least ``V_t`` goes next. A tenant that becomes
   backlogged (nothing waiting or running before) starts at ``max(V_t, V_min)``, ``V_min``
   the least ``V`` of the tenants active then: no credit is banked while idle. So a lone
   tenant is served alone, and tenants that stay backlogged share the service in proportion
   to their weights, each within one call's service of its share.
3. **Session**, within a tenant and class: least attained service first, with aging:
   ``key = A_s − wait_s`` (``A_s``: the session's measured service seconds on this node so
   far), then the earlier deadline (arrival + ``deadline_s``), then arrival. A short session
   overtakes a long one; a call that has waited ``A_s`` seconds is behind no fresh session.

4. **Guard of the higher classes' steps** (continuous batching gives every running call the
   same steps, and a step's time grows with the batch and its context: runtime/costmodel.py
   ``decode_step_time_s``). A call is admitted beside running calls of a higher class only
   if ``step(all running + it) ≤ class_slowdown · step(the higher-class calls alone)``
   (:func:`lower_class_fits`); else it waits, as for memory, until they finish or it is
   promoted (rule 1). So an interactive turn beside a bulk tenant runs at most
   ``class_slowdown`` slower per step than alone, and the bulk tenant keeps every step the
   interactive calls leave.

5. **Steps of the calls already running** (runtime/engine.py ``class_steps``; an engine
   with ``StepsByClass`` applies it through runtime/engines/class_holds.py ``ClassHolds``).
   Rule 4 keeps a lower-class call out while it would slow the higher classes' steps, but
   calls admitted before a higher-class call arrived, and their prefill chunks, still share
   its steps. So whenever a call joins an engine's steps or leaves them, the engine steps the
   best class's calls, and each lower-class call (best class first, then admission order)
   only while the decode step with it stays ≤ ``class_slowdown`` × the step of the best class
   alone; the others are *preempted* until the next such decision: they keep their KV where
   it is (HBM) and resume when the higher-class calls finish or leave room. A call is
   preempted at most ``preempt_limit`` times (a preemption: stepping, or
   ready to, then held); after that it takes every step, so every preempted call finishes,
   and no stream of higher-class calls holds it back for ever. Its cost: the steps it waits,
   nothing moved (its KV stays in HBM; vLLM's own preemption frees it and recomputes:
   docs/sources.md §5).

``ServiceAccounts`` keeps ``V_t``, ``A_s`` and who is active; ``fair_order`` walks the queue,
taking the charges of the calls admitted meanwhile into account (the intake tells the
accounts as it admits). Tested with hypothesis: shares converge to the weights, a lone tenant
gets everything, every call is served within the stated bound
(tests/unit/runtime/scheduling/test_fairness.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from talaria.core.types import CallRequest
from talaria.runtime.scheduling.events import SessionEvents

DEFAULT_STARVATION_S = 120.0
"""How long a call waits before it is promoted a class: two 60 s quanta (the paper preset's
slot length, docs/results.md), so a batch call waits at most four quanta behind interactive
arrivals."""


class Queued(Protocol):
    """A waiting call as the policy sees it (runtime/scheduling/state.py ``WaitingCall``)."""

    @property
    def request(self) -> CallRequest:
        """The call."""

    @property
    def arrival_s(self) -> float:
        """When it joined the queue (clock seconds)."""


@dataclass
class ServiceAccounts(SessionEvents):
    """What the node has served each tenant (``vtime``: virtual seconds; ``served``: measured
    service seconds) and each session (``attained``: service seconds), and which tenants are
    active (a call waiting or running, ``running``: their admitted calls not yet finished).
    It hears the node's session events (scheduling/events.py): a session's ``attained`` goes
    with the session."""

    vtime: dict[str, float] = field(default_factory=dict)
    served: dict[str, float] = field(default_factory=dict)
    attained: dict[str, float] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)
    active: set[str] = field(default_factory=set)

    def backlogged(self, tenants: set[str]) -> None:
        """``tenants`` have calls waiting now: a tenant not active before starts at the least
        virtual time of the active ones (rule 2)."""
        arriving = tenants - self.active
        if arriving and self.active:
            floor = min(self.vtime.get(t, 0.0) for t in self.active)
            for tenant in arriving:
                self.vtime[tenant] = max(self.vtime.get(tenant, 0.0), floor)
        self.active |= tenants

    def call_admitted(self, request: CallRequest, estimate_s: float) -> None:
        """A call was admitted with an estimated service of ``estimate_s``."""
        tenant = request.tenant
        self.vtime[tenant] = self.vtime.get(tenant, 0.0) + estimate_s / request.tenant_weight
        self.running[tenant] = self.running.get(tenant, 0) + 1

    def call_ended(self, request: CallRequest, estimate_s: float, measured_s: float) -> None:
        """An admitted call ended after ``measured_s`` of service: the difference from its
        estimate is charged, and its session's attained service grows."""
        tenant = request.tenant
        self.vtime[tenant] = self.vtime.get(tenant, 0.0) + (
            (measured_s - estimate_s) / request.tenant_weight
        )
        self.served[tenant] = self.served.get(tenant, 0.0) + measured_s
        key = request.session_key
        self.attained[key] = self.attained.get(key, 0.0) + measured_s
        left = self.running.get(tenant, 0) - 1
        if left > 0:
            self.running[tenant] = left
        else:
            self.running.pop(tenant, None)

    def settle(self, waiting_tenants: set[str]) -> None:
        """After a pass: the active tenants are those with a call waiting or running."""
        self.active = waiting_tenants | set(self.running)

    def session_ended(self, session_key: str) -> None:
        """The node forgets the session."""
        self.attained.pop(session_key, None)


Call = TypeVar("Call", bound=Queued)


def lower_class_fits(step_with_s: float, step_higher_s: float, class_slowdown: float) -> bool:
    """Rule 4: whether a call may join the running batch beside higher-class calls whose own
    decode step would take ``step_higher_s``, the batch's step with it ``step_with_s``."""
    return step_with_s <= class_slowdown * step_higher_s


def effective_rank(request: CallRequest, waited_s: float, starvation_s: float) -> int:
    """The class a call is served in after ``waited_s`` (rule 1): its own, one higher per
    ``starvation_s`` waited, at most interactive (0)."""
    return max(0, request.priority.rank - int(waited_s // starvation_s))


def fair_order(
    waiting: Sequence[Call],
    accounts: ServiceAccounts,
    now_s: float,
    starvation_s: float = DEFAULT_STARVATION_S,
) -> Iterator[Call]:
    """``waiting`` in the order the module docstring gives; a generator: the tenant order is
    read again after each call yielded, so the calls the caller admits meanwhile (and charges
    to ``accounts``) move their tenant back."""
    accounts.backlogged({w.request.tenant for w in waiting})
    by_class: dict[int, dict[str, list[tuple[float, float, float, int, Call]]]] = {}
    for order, call in enumerate(waiting):
        request = call.request
        waited = now_s - call.arrival_s
        rank = effective_rank(request, waited, starvation_s)
        deadline = call.arrival_s + request.deadline_s if request.deadline_s is not None else 1e300
        key = accounts.attained.get(request.session_key, 0.0) - waited
        by_class.setdefault(rank, {}).setdefault(request.tenant, []).append(
            (key, deadline, call.arrival_s, order, call)
        )
    for rank in sorted(by_class):
        tenants = by_class[rank]
        for calls in tenants.values():
            calls.sort(key=lambda c: c[:4])
        heap = [(accounts.vtime.get(t, 0.0), t, 0) for t in sorted(tenants)]
        heapq.heapify(heap)
        while heap:
            _, tenant, next_index = heapq.heappop(heap)
            calls = tenants[tenant]
            yield calls[next_index][4]
            if next_index + 1 < len(calls):
                heapq.heappush(heap, (accounts.vtime.get(tenant, 0.0), tenant, next_index + 1))
