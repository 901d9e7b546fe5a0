"""The calls the proxy routed and has not seen end (proxy/runtimes/pool.py ``dispatched``,
``settled``, ``with_own_calls``): a status read before them still counts them as running."""

from __future__ import annotations

from dataclasses import replace

import pytest

from talaria.core.clock import TimeScale
from talaria.core.status import InstanceStatus
from talaria.proxy.runtimes.pool import RuntimePool


def _status(name: str, running: int) -> InstanceStatus:
    return InstanceStatus(
        instance=name, at_s=0.0, active_model=None, models={}, running_calls=running
    )


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
def test_own_calls_raise_the_running_calls_read(
    dispatched: list[str], settled: list[str], reported: dict[str, int], seen: dict[str, int]
) -> None:
    pool = RuntimePool([], TimeScale(1.0))
    for name in dispatched:
        pool.dispatched(name)
    for name in settled:
        pool.settled(name)
    statuses = [_status(n, r) for n, r in reported.items()]
    raised = pool.with_own_calls(statuses)
    assert {s.instance: s.running_calls for s in raised} == seen
    assert [replace(s, running_calls=0) for s in raised] == [
        replace(s, running_calls=0) for s in statuses
    ]  # nothing else changes
