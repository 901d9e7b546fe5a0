"""The fair order (runtime/scheduling/fairness.py), as properties over generated queues and
arrivals: no call lost, classes strictly first until the starvation bound promotes a call,
tenants' service converging to their weights, a lone tenant's order independent of its weight,
and sessions ordered by least attained service with aging."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from talaria.core.types import CallRequest, Priority
from talaria.runtime.scheduling.fairness import (
    ServiceAccounts,
    effective_rank,
    fair_order,
    lower_class_fits,
)

STARVATION_S = 120.0


@dataclass(frozen=True, eq=False)
class Waiting:
    request: CallRequest
    arrival_s: float


def call(
    n: int,
    tenant: str = "t0",
    session: str | None = None,
    priority: Priority = Priority.STANDARD,
    weight: float = 1.0,
    arrival_s: float = 0.0,
    deadline_s: float | None = None,
) -> Waiting:
    request = CallRequest(
        request_id=f"r{n}",
        session_key=session or f"s{n}",
        model="m",
        prompt_tokens=100,
        max_output_tokens=10,
        tenant=tenant,
        tenant_weight=weight,
        priority=priority,
        deadline_s=deadline_s,
    )
    return Waiting(request, arrival_s)


queued = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(list(Priority)),
        st.floats(0.0, 1000.0),
        st.sampled_from(["s1", "s2", "s3", "s4"]),
    ),
    max_size=30,
)


def _queue(rows: list[tuple[str, Priority, float, str]]) -> list[Waiting]:
    return [
        call(n, tenant, f"{tenant}/{session}", priority, arrival_s=arrival)
        for n, (tenant, priority, arrival, session) in enumerate(rows)
    ]


@settings(max_examples=200, deadline=None)
@given(
    rows=queued,
    now=st.floats(1000.0, 2000.0),
    vtimes=st.lists(st.floats(0, 500), min_size=3, max_size=3),
)
def test_every_waiting_call_comes_out_once_and_classes_go_in_order(
    rows: list[tuple[str, Priority, float, str]], now: float, vtimes: list[float]
) -> None:
    waiting = _queue(rows)
    accounts = ServiceAccounts(vtime=dict(zip("abc", vtimes, strict=True)))
    order = list(fair_order(waiting, accounts, now, STARVATION_S))
    assert sorted(id(w) for w in order) == sorted(id(w) for w in waiting)
    ranks = [effective_rank(w.request, now - w.arrival_s, STARVATION_S) for w in order]
    assert ranks == sorted(ranks)


@given(priority=st.sampled_from(list(Priority)), waited=st.floats(0.0, 1e6))
def test_no_call_waits_more_than_twice_the_starvation_bound_behind_higher_classes(
    priority: Priority, waited: float
) -> None:
    rank = effective_rank(call(0, priority=priority).request, waited, STARVATION_S)
    assert rank <= priority.rank
    if waited >= 2 * STARVATION_S:
        assert rank == 0  # served among the interactive calls, by tenant share and session
    if waited < STARVATION_S:
        assert rank == priority.rank


def _serve(
    jobs: list[tuple[str, float, float, float]], weights: dict[str, float]
) -> list[dict[str, float]]:
    """One server, every tenant backlogged with ``jobs`` (tenant, estimate, measured, ·): the
    fair order picks the next call, the accounts are charged its estimate, then its measured
    service when it ends. Returns each tenant's service after every call."""
    queue = [
        call(n, tenant, f"{tenant}/{n}", weight=weights[tenant])
        for n, (tenant, *_) in enumerate(jobs)
    ]
    cost = {w.request.request_id: job[1:3] for w, job in zip(queue, jobs, strict=True)}
    accounts = ServiceAccounts()
    served = dict.fromkeys(weights, 0.0)
    history = []
    while queue:
        first = next(fair_order(queue, accounts, 0.0, STARVATION_S))
        estimate, measured = cost[first.request.request_id]
        accounts.call_admitted(first.request, estimate)
        accounts.call_ended(first.request, estimate, measured)
        served[first.request.tenant] += measured
        queue.remove(first)
        accounts.settle({w.request.tenant for w in queue})
        history.append(dict(served))
    return history


service = st.floats(0.1, 30.0)


@settings(max_examples=100, deadline=None)
@given(
    weights=st.lists(st.floats(0.1, 100.0), min_size=2, max_size=4),
    costs=st.lists(st.tuples(service, service), min_size=40, max_size=40),
)
def test_backlogged_tenants_service_follows_their_weights_within_one_call(
    weights: list[float], costs: list[tuple[float, float]]
) -> None:
    """Start-time fair queueing over measured seconds: while every tenant still has calls
    waiting, no tenant's service ÷ weight exceeds another's by more than one call's
    measured service ÷ its weight, however wrong the estimates were."""
    tenants = {f"t{i}": w for i, w in enumerate(weights)}
    jobs = [(t, e, m, 0.0) for t in tenants for e, m in costs]
    bound = max(m / w for t, w in tenants.items() for _, m in costs)
    for served in _serve(jobs, tenants)[: len(costs)]:  # every tenant still backlogged
        normalised = [served[t] / w for t, w in tenants.items()]
        assert max(normalised) - min(normalised) <= bound + 1e-6


@settings(max_examples=100, deadline=None)
@given(rows=queued, weight=st.floats(0.01, 100.0), vtime=st.floats(0, 1e6))
def test_a_lone_tenants_order_does_not_depend_on_its_weight_or_past(
    rows: list[tuple[str, Priority, float, str]], weight: float, vtime: float
) -> None:
    """A share is not a limit: with one tenant, its weight and virtual time change nothing."""
    rows = [("a", *rest) for _, *rest in rows]  # type: ignore[misc]
    waiting = _queue(rows)
    plain = [w.request.request_id for w in fair_order(waiting, ServiceAccounts(), 1000.0)]
    weighted = [
        Waiting(dataclasses.replace(w.request, tenant_weight=weight), w.arrival_s) for w in waiting
    ]
    accounts = ServiceAccounts(vtime={"a": vtime})
    assert [w.request.request_id for w in fair_order(weighted, accounts, 1000.0)] == plain


def test_within_a_tenant_least_attained_service_goes_first_with_aging() -> None:
    long_session = call(0, session="long", arrival_s=0.0)
    short_session = call(1, session="short", arrival_s=50.0)
    accounts = ServiceAccounts(attained={"long": 100.0})
    # at 60 s: long's key 100 − 60 = 40, short's 0 − 10 = −10: the short session first
    assert [
        w.request.session_key for w in fair_order([long_session, short_session], accounts, 60.0)
    ] == [
        "short",
        "long",
    ]
    # a call that has waited longer than its session's service is behind no fresh session
    fresh = call(2, session="fresh", arrival_s=200.0)
    assert next(fair_order([fresh, long_session], accounts, 200.0)) is long_session


def test_the_earlier_deadline_breaks_ties_then_arrival() -> None:
    later = call(0, session="x", arrival_s=0.0, deadline_s=500.0)
    sooner = call(1, session="y", arrival_s=0.0, deadline_s=30.0)
    none = call(2, session="z", arrival_s=0.0)
    order = [
        w.request.session_key for w in fair_order([none, later, sooner], ServiceAccounts(), 0.0)
    ]
    assert order == ["y", "x", "z"]


def test_a_tenant_becoming_backlogged_starts_at_the_active_ones_least_virtual_time() -> None:
    accounts = ServiceAccounts(vtime={"busy": 500.0, "idle": 3.0}, active={"busy"})
    accounts.backlogged({"busy", "idle"})
    assert accounts.vtime["idle"] == 500.0  # no credit banked while idle
    accounts.backlogged({"busy", "idle"})
    assert accounts.vtime["idle"] == 500.0


def test_finishing_charges_the_measured_service_and_frees_the_tenant() -> None:
    accounts = ServiceAccounts()
    request = call(0, tenant="a", session="s", weight=2.0).request
    accounts.call_admitted(request, 4.0)
    assert accounts.vtime["a"] == 2.0 and accounts.running == {"a": 1}
    accounts.call_ended(request, 4.0, 10.0)
    assert accounts.vtime["a"] == 5.0 and accounts.attained["s"] == 10.0
    assert accounts.running == {}
    accounts.settle(set())
    assert accounts.active == set()


CLASS_GUARD = [
    # step with the call, step of the higher classes alone, allowed slowdown, admitted
    (1.0, 1.0, 1.2, True),
    (1.2, 1.0, 1.2, True),
    (1.21, 1.0, 1.2, False),
    (3.0, 1.0, 1.2, False),
    (3.0, 1.0, 3.0, True),
]


def test_a_lower_class_joins_only_within_the_higher_classes_slowdown() -> None:
    for with_it, alone, slowdown, fits in CLASS_GUARD:
        assert lower_class_fits(with_it, alone, slowdown) is fits, (with_it, alone, slowdown)
