"""Routing properties over random snapshots (hypothesis): every score is in [0, 1], every
decision is a candidate, and adding an instance that scores below the winner never changes the
winner, under every router."""

from __future__ import annotations

import random

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from talaria.core.routing import (
    ROUTER_NAMES,
    SCORERS,
    NoInstanceError,
    RouteRequest,
    RoutingConfig,
    route,
)
from talaria.core.routing.picker import score_candidates
from talaria.core.status import InstanceStatus, ModelResidency, ModelState, SessionKvStatus

CONFIG = RoutingConfig()
MODELS = ("m", "n")
SESSIONS = ("s", "t")
seconds = st.floats(0.0, 1e4, allow_nan=False)


@st.composite
def residencies(draw: st.DrawFn, model: str) -> ModelResidency:
    state = draw(st.sampled_from(ModelState))
    wait = 0.0 if state is ModelState.ACTIVE else draw(seconds)
    return ModelResidency(model, state, wait, draw(st.floats(0, 1)), draw(seconds))


@st.composite
def kv_entries(draw: st.DrawFn) -> SessionKvStatus:
    location = draw(st.sampled_from(["hbm", "host"]))
    restore = 0.0 if location == "hbm" else draw(seconds)
    return SessionKvStatus(
        location,
        draw(st.integers(0, 200_000)),
        draw(st.sampled_from(MODELS)),
        restore,
        draw(seconds),
    )


@st.composite
def statuses(draw: st.DrawFn, name: str) -> InstanceStatus:
    hosted = draw(st.lists(st.sampled_from(MODELS), unique=True, max_size=2))
    models = {m: draw(residencies(m)) for m in hosted}
    sessions = draw(st.dictionaries(st.sampled_from(SESSIONS), kv_entries(), max_size=2))
    reserved = draw(st.dictionaries(st.sampled_from(SESSIONS), st.floats(0, 1e12), max_size=2))
    active = next((m for m, r in models.items() if r.state is ModelState.ACTIVE), None)
    return InstanceStatus(
        instance=name,
        at_s=0.0,
        active_model=active,
        models=models,
        sessions=sessions,
        reserved=reserved,
        waiting_calls=draw(st.integers(0, 100)),
        waiting_prompt_tokens=draw(st.integers(0, 10**7)),
        running_calls=draw(st.integers(0, 1000)),
        kv_utilization=draw(st.floats(0, 1)),
    )


@st.composite
def clusters(draw: st.DrawFn) -> list[InstanceStatus]:
    count = draw(st.integers(0, 5))
    return [draw(statuses(f"i{k}")) for k in range(count)]


names = st.none() | st.sampled_from(["i0", "i1", "i2", "zz"])
requests = st.builds(
    RouteRequest,
    session_key=st.sampled_from(SESSIONS),
    model=st.sampled_from(MODELS),
    prompt_tokens=st.integers(1, 200_000),
    last_instance=names,
    reserved_instance=names,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(request=requests, status=statuses("i0"))
def test_every_score_is_in_the_unit_interval(request: RouteRequest, status: InstanceStatus) -> None:
    for scorer in SCORERS.values():
        assert 0.0 <= scorer(request, status, CONFIG) <= 1.0


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    request=requests,
    cluster=clusters(),
    router=st.sampled_from(ROUTER_NAMES),
    seed=st.integers(0, 2**32),
)
def test_the_decision_is_always_a_candidate(
    request: RouteRequest, cluster: list[InstanceStatus], router: str, seed: int
) -> None:
    candidates = {s.instance for s in cluster if request.model in s.models}
    try:
        decision = route(router, request, cluster, CONFIG, random.Random(seed))
    except NoInstanceError:
        assert not candidates
        return
    assert decision.instance in candidates
    assert set(decision.scores) == candidates
    assert decision.router == router


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    request=requests,
    cluster=clusters(),
    extra=statuses("i9"),
    router=st.sampled_from(ROUTER_NAMES),
    seed=st.integers(0, 2**32),
)
def test_adding_a_worse_instance_never_changes_the_winner(
    request: RouteRequest,
    cluster: list[InstanceStatus],
    extra: InstanceStatus,
    router: str,
    seed: int,
) -> None:
    assume(any(request.model in s.models for s in cluster))
    before = route(router, request, cluster, CONFIG, random.Random(seed))
    weights = dict(CONFIG.weights(router))
    weights = {k: weights[k] for k in next(iter(before.scores.values())) if k != "total"}
    extra_total = score_candidates(request, [extra], weights, CONFIG)[extra.instance]["total"]
    assume(extra_total < before.scores[before.instance]["total"])
    after = route(router, request, [*cluster, extra], CONFIG, random.Random(seed))
    assert after.instance == before.instance
