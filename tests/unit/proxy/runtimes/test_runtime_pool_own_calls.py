"""The calls the proxy routed and has not seen end (proxy/runtimes/pool.py ``dispatched``,
``settled``, ``with_own_calls``): a status read before them counts them as a fresh status
would, each a running call and a live session of its model."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from talaria.core.clock import TimeScale
from talaria.core.routing.request import RouteRequest
from talaria.core.routing.scorers.instance_pressure import instance_pressure
from talaria.core.routing.settings import RoutingConfig
from talaria.core.status import InstanceStatus, ModelResidency, ModelState
from talaria.proxy.runtimes.pool import RuntimePool

MODEL = "m"


def _status(name: str, running: int, live: int = 0) -> InstanceStatus:
    residency = ModelResidency(MODEL, ModelState.ACTIVE, 0.0, live_sessions=live)
    return InstanceStatus(
        instance=name,
        at_s=0.0,
        active_model=MODEL,
        models={MODEL: residency},
        running_calls=running,
    )


def _pool(dispatched: list[str], settled: list[str]) -> RuntimePool:
    pool = RuntimePool([], TimeScale(1.0))
    for name in dispatched:
        pool.dispatched(name, MODEL)
    for name in settled:
        pool.settled(name, MODEL)
    return pool


@pytest.mark.parametrize(
    ("dispatched", "settled", "reported", "seen"),
    [
        ([], [], {"a": 0, "b": 0}, {"a": 0, "b": 0}),  # nothing routed: the statuses as read
        (["a", "a", "b"], [], {"a": 0, "b": 0}, {"a": 2, "b": 1}),  # read before the calls
        (["a", "a"], ["a"], {"a": 0, "b": 0}, {"a": 1, "b": 0}),  # one of them ended
        (["a", "a"], ["a", "a"], {"a": 0, "b": 0}, {"a": 0, "b": 0}),  # both ended
        (["a"], [], {"a": 3, "b": 0}, {"a": 3, "b": 0}),  # the instance counts more (others')
        (["a"], ["a", "a"], {"a": 0, "b": 0}, {"a": 0, "b": 0}),  # never below zero
    ],
)
def test_own_calls_raise_the_running_calls_and_live_sessions_read(
    dispatched: list[str], settled: list[str], reported: dict[str, int], seen: dict[str, int]
) -> None:
    statuses = [_status(n, r, live=r) for n, r in reported.items()]
    raised = _pool(dispatched, settled).with_own_calls(statuses)
    assert {s.instance: s.running_calls for s in raised} == seen
    assert {s.instance: s.models[MODEL].live_sessions for s in raised} == seen
    blank = {MODEL: replace(statuses[0].models[MODEL], live_sessions=0)}
    assert [replace(s, running_calls=0, models=blank) for s in raised] == [
        replace(s, running_calls=0, models=blank) for s in statuses
    ]  # nothing else changes


def test_a_model_the_status_does_not_list_gets_no_live_session() -> None:
    pool = RuntimePool([], TimeScale(1.0))
    pool.dispatched("a", "other")
    (raised,) = pool.with_own_calls([_status("a", 0)])
    assert raised.running_calls == 1
    assert raised.models[MODEL].live_sessions == 0


@given(earlier=st.integers(0, 12), routed=st.integers(0, 12), admitted=st.integers(0, 12))
def test_a_status_read_before_the_calls_scores_as_one_read_after_them(
    earlier: int, routed: int, admitted: int
) -> None:
    """This proxy routed ``earlier`` calls of new sessions to an instance, then ``routed``
    more, none ended. A status read after only ``admitted`` of the later ones (at most all)
    shows the others neither as running calls nor as live sessions. Whatever ``admitted``,
    the instance's pressure as routing sees it is the fresh status's: a stale status does not
    make an instance look lighter (it did when unseen calls counted as running calls only)."""
    admitted = min(admitted, routed)
    config = RoutingConfig()
    request = RouteRequest(session_key="new", model=MODEL, prompt_tokens=2000)
    pool = _pool(["a"] * (earlier + routed), [])
    fresh = _status("a", earlier + routed, live=earlier + routed)
    read_before = _status("a", earlier + admitted, live=earlier + admitted)
    (seen,) = pool.with_own_calls([read_before])
    assert seen == fresh
    assert instance_pressure(request, seen, config) == instance_pressure(request, fresh, config)
