"""Which instances take a call of a model some of them drain (proxy/runtimes/pool.py
``routable``): a draining instance keeps its own sessions and takes no new one while another
serves the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import pytest

from talaria.core.clock import TimeScale
from talaria.core.status import InstanceStatus
from talaria.proxy.runtimes.base import RuntimeClient
from talaria.proxy.runtimes.pool import RuntimePool


@dataclass
class Draining:
    """The part of a runtime client ``routable`` reads: the models its status lists as
    draining."""

    name: str
    draining_models: frozenset[str] = frozenset()


def _status(name: str) -> InstanceStatus:
    return InstanceStatus(instance=name, at_s=0.0, active_model=None, models={})


@pytest.mark.parametrize(
    ("draining", "answered", "last", "routable"),
    [
        ({}, ["r0", "r1"], None, ["r0", "r1"]),  # nothing drains
        ({"r0": {"m"}}, ["r0", "r1"], None, ["r1"]),  # a new session: not to r0
        ({"r0": {"m"}}, ["r0", "r1"], "r0", ["r0", "r1"]),  # r0's session keeps its KV
        ({"r0": {"m"}}, ["r0", "r1"], "r1", ["r1"]),
        ({"r0": {"other"}}, ["r0", "r1"], None, ["r0", "r1"]),  # another model drains
        ({"r0": {"m"}, "r1": {"m"}}, ["r0", "r1"], None, ["r0", "r1"]),  # all drain: all serve
        ({"r0": {"m"}}, ["r0"], None, ["r0"]),  # r1 did not answer: r0 is all there is
    ],
)
def test_a_draining_instance_takes_only_its_own_sessions(
    draining: dict[str, set[str]], answered: list[str], last: str | None, routable: list[str]
) -> None:
    runtimes = [Draining(n, frozenset(draining.get(n, ()))) for n in ("r0", "r1")]
    pool = RuntimePool(cast(list[RuntimeClient], runtimes), TimeScale(1.0))
    statuses = [_status(n) for n in answered]
    assert [s.instance for s in pool.routable("m", statuses, last)] == routable
