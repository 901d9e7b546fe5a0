"""The ``parent_kv`` scorer (a sub-agent's parent's KV on the instance) on hand-built
snapshots, and the talaria router sending a child to its parent's instance unless load
outweighs the prefix it shares."""

from __future__ import annotations

import random

import pytest

from talaria.core.routing import RouteRequest, RoutingConfig, parent_kv, route
from talaria.core.status import InstanceStatus, ModelResidency, ModelState, SessionKvStatus

CONFIG = RoutingConfig()
CHILD = RouteRequest("child", "m", 1000, parent_key="parent", parent_prefix_tokens=400)


def instance(name: str = "i0", running_calls: int = 0, **kv: SessionKvStatus) -> InstanceStatus:
    """An instance with model "m" active and the given sessions' KV."""
    models = {"m": ModelResidency("m", ModelState.ACTIVE, 0.0)}
    return InstanceStatus(name, 0.0, "m", models, dict(kv), running_calls=running_calls)


def kv(location: str = "hbm", tokens: int = 4000, model: str = "m") -> SessionKvStatus:
    restore = 0.25 if location == "host" else 0.0
    return SessionKvStatus(location, tokens, model, restore, 1.0)


@pytest.mark.parametrize(
    ("request_", "status", "expected"),
    [
        (CHILD, instance(parent=kv()), 0.4),  # 400 of 1,000 tokens, in HBM
        (CHILD, instance(parent=kv("host")), 0.4 * 0.75),  # restore saves 3/4 of a recompute
        (CHILD, instance(parent=kv(tokens=100)), 0.1),  # the parent holds only 100 tokens
        (CHILD, instance(parent=kv(model="other")), 0.0),  # another model's KV
        (CHILD, instance(), 0.0),  # the parent's KV is not here
        (CHILD, instance(parent=kv(), child=kv()), 0.0),  # the child's own KV is here
        (RouteRequest("child", "m", 1000), instance(parent=kv()), 0.0),  # no parent named
        (
            RouteRequest("child", "m", 1000, parent_key="parent"),
            instance(parent=kv()),
            0.0,
        ),  # nothing shared
        (
            RouteRequest("child", "m", 300, parent_key="parent", parent_prefix_tokens=400),
            instance(parent=kv()),
            1.0,
        ),  # never over 1
    ],
)
def test_parent_kv(request_: RouteRequest, status: InstanceStatus, expected: float) -> None:
    assert parent_kv(request_, status, CONFIG) == pytest.approx(expected)


def test_a_child_goes_where_its_parent_is() -> None:
    statuses = [instance("a"), instance("b", parent=kv())]
    decision = route("talaria", CHILD, statuses, CONFIG, random.Random(0))
    assert (decision.instance, decision.reason) == ("b", "kv-parent")
    assert decision.scores["a"]["parent_kv"] == 0.0
    # with the scorer at weight 0 the two instances tie: the seeded draw decides
    table = {**CONFIG.talaria, "parent_kv": 0.0}
    blind = RoutingConfig(talaria=type(CONFIG.talaria)(table))
    assert route("talaria", CHILD, statuses, blind, random.Random(0)).reason == "tie-break"


@pytest.mark.parametrize(
    ("running_calls", "expected"),
    [
        (16, "b"),  # load 0.5: pressure 0.67, 0.5 × (1 − 0.67) = 0.17 < 0.3 shared
        (96, "a"),  # load 3: pressure 0.25, 0.5 × (1 − 0.25) = 0.375 > 0.3 shared
    ],
)
def test_load_outweighs_a_small_shared_prefix(running_calls: int, expected: str) -> None:
    """The parent's instance b loses when 0.5 × (pressure(a) − pressure(b)) > the share."""
    small = RouteRequest("child", "m", 1000, parent_key="parent", parent_prefix_tokens=300)
    statuses = [instance("a"), instance("b", running_calls, parent=kv())]
    assert route("talaria", small, statuses, CONFIG, random.Random(0)).instance == expected
