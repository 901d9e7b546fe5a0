"""Demand-aware slots and co-residency: the pure policy (slots.py), the device-sharing formula
(resources.DeviceShare), and the node scheduler on small catalogs where two models fit
together and a third does not."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talaria.core.catalog import Catalog
from talaria.core.clock import LoopClock, run_virtual
from talaria.core.model_spec import ModelSpec
from talaria.core.types import CallRequest, CallResult
from talaria.runtime.memory.resources import DeviceShare
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import ROUND, TALARIA, SchedulerFlags
from talaria.runtime.scheduling.node import NodeScheduler
from talaria.runtime.scheduling.slots import (
    Demand,
    DemandPolicy,
    demand_score,
    next_model_by_demand,
    resident_set,
    shared_work,
    slot_length_s,
)
from talaria.sim.replay import NodeSetup, build_node
from tests.unit.runtime.scheduling.scenarios import PROFILE, SERVER, tiny_model

Q = 60.0
POLICY = DemandPolicy(Q)
ORDER = ("a", "b", "c")


# -- the pure policy ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("active", "demands", "expected"),
    [
        # nothing queued anywhere: no slot to give (uncontended)
        ("a", {"a": Demand(0, 5), "b": Demand(0, 3)}, None),
        # the only model with queued calls
        ("a", {"a": Demand(0, 9), "b": Demand(1)}, "b"),
        # more work (queued + expected back) wins
        ("a", {"b": Demand(1, 0, 1.0), "c": Demand(2, 3, 1.0)}, "c"),
        # equal scores: round-robin order after the active model
        ("b", {"a": Demand(1), "c": Demand(1)}, "c"),
        ("c", {"a": Demand(1), "b": Demand(1)}, "a"),
        # age weighs: 1 call that waited 2 quanta (score 3) beats 2 fresh ones (score 2)
        ("a", {"b": Demand(1, 0, 2 * Q - 1), "c": Demand(2, 0, 0.0)}, "b"),
        # a starving model goes first whatever the others' demand...
        ("a", {"b": Demand(1, 0, 2 * Q), "c": Demand(50, 50, Q)}, "b"),
        # ...and of several starving ones, the one that has waited longest
        ("a", {"b": Demand(1, 0, 2 * Q), "c": Demand(1, 0, 3 * Q)}, "c"),
    ],
)
def test_next_model_by_demand(
    active: str, demands: dict[str, Demand], expected: str | None
) -> None:
    assert next_model_by_demand(ORDER, active, demands, POLICY) == expected


@pytest.mark.parametrize(
    ("model", "demands", "factor"),
    [
        ("a", {"a": Demand(3)}, 1.0),  # alone in demand: the base quantum
        ("a", {"a": Demand(1), "b": Demand(1)}, 1.0),  # equal shares
        ("a", {"a": Demand(3), "b": Demand(1)}, 1.5),  # 2 × 3/4
        ("a", {"a": Demand(10), "b": Demand(1), "c": Demand(1)}, 2.0),  # capped: 3 × 10/12
        ("b", {"a": Demand(9), "b": Demand(1)}, 0.5),  # floored: 2 × 1/10
        ("a", {"a": Demand(0, 2), "b": Demand(2)}, 1.0),  # expected-back counts as demand
    ],
)
def test_slot_length_follows_demand_share(
    model: str, demands: dict[str, Demand], factor: float
) -> None:
    assert slot_length_s(model, demands, POLICY) == pytest.approx(factor * Q)


WEIGHTS = {"a": 40.0, "b": 40.0, "c": 40.0}
FLOORS = {"a": 10.0, "b": 10.0, "c": 30.0}


@pytest.mark.parametrize(
    ("first", "current", "demands", "capacity", "expected"),
    [
        # room for two: the first, then the one with more demand
        ("a", [], {"a": Demand(1), "b": Demand(1), "c": Demand(3)}, 130.0, ["a", "c"]),
        # a resident model with no demand stays when it fits (no switch later)...
        ("c", ["b"], {"c": Demand(1)}, 130.0, ["c", "b"]),
        # ...but a model neither resident nor in demand is never woken
        ("c", [], {"c": Demand(1)}, 130.0, ["c"]),
        # ties keep the resident one
        ("a", ["c"], {"a": Demand(1), "b": Demand(1), "c": Demand(1)}, 130.0, ["a", "c"]),
        # c's larger KV floor: a + b + floor 10 fit in 100, a + c + floor 30 do not
        ("a", [], {"a": Demand(1), "b": Demand(1), "c": Demand(3)}, 100.0, ["a", "b"]),
        # the first alone, even when nothing fits beside it
        ("a", ["b"], {"a": Demand(1), "b": Demand(5)}, 80.0, ["a"]),
    ],
)
def test_resident_set(
    first: str,
    current: list[str],
    demands: dict[str, Demand],
    capacity: float,
    expected: list[str],
) -> None:
    assert resident_set(first, current, demands, WEIGHTS, FLOORS, capacity, Q) == expected


demand_st = st.builds(
    Demand,
    waiting=st.integers(0, 5),
    expected_back=st.integers(0, 5),
    oldest_wait_s=st.floats(0, 5 * Q),
)


SHARED_WORK = [
    # one tenant: the plain counts
    ({"t": {"a": 5, "b": 1}}, {"t": 1.0}, {"a": 5.0, "b": 1.0}),
    ({"t": {"a": 5, "b": 1}}, {"t": 7.0}, {"a": 5.0, "b": 1.0}),
    # a burst of 100 on a beside 1 call on b: each tenant brings half the node's work
    ({"bulk": {"a": 100}, "ide": {"b": 1}}, {"bulk": 1.0, "ide": 1.0}, {"a": 50.5, "b": 50.5}),
    # weights: the heavier tenant's models weigh more
    ({"x": {"a": 3}, "y": {"b": 3}}, {"x": 2.0, "y": 1.0}, {"a": 4.0, "b": 2.0}),
    # a tenant spread over two models, one beside it on the first
    ({"x": {"a": 2, "b": 2}, "y": {"a": 4}}, {"x": 1.0, "y": 1.0}, {"a": 6.0, "b": 2.0}),
    # tenants without work bring nothing
    ({"x": {"a": 2}, "idle": {}}, {"x": 1.0, "idle": 5.0}, {"a": 2.0}),
]


@pytest.mark.parametrize(("work", "weights", "expected"), SHARED_WORK)
def test_shared_work_weighs_each_model_by_the_tenants_shares(
    work: dict[str, dict[str, int]], weights: dict[str, float], expected: dict[str, float]
) -> None:
    got = shared_work(work, weights)
    assert got == pytest.approx(expected)
    assert sum(got.values()) == pytest.approx(sum(sum(m.values()) for m in work.values()))


def test_a_burst_on_one_model_does_not_take_the_next_slot_from_an_older_share() -> None:
    counted = {"a": Demand(100, 0, 10.0), "b": Demand(1, 0, 20.0)}
    shared = shared_work({"bulk": {"a": 100}, "ide": {"b": 1}}, {"bulk": 1.0, "ide": 1.0})
    weighed = {m: Demand(d.waiting, 0, d.oldest_wait_s, shared[m]) for m, d in counted.items()}
    assert next_model_by_demand(ORDER, "c", counted, POLICY) == "a"  # 100 calls win
    assert next_model_by_demand(ORDER, "c", weighed, POLICY) == "b"  # equal shares: the older


@settings(deadline=None)  # pure and fast; a loaded CI machine must not fail it on time
@given(
    demands=st.dictionaries(st.sampled_from(ORDER), demand_st, max_size=3),
    active=st.sampled_from((None, *ORDER)),
)
def test_next_model_is_work_conserving(demands: dict[str, Demand], active: str | None) -> None:
    """A model is chosen iff some model has queued calls, and it is one of them; a starving
    model is never passed over for one that waited less."""
    chosen = next_model_by_demand(ORDER, active, demands, POLICY)
    queued = {m for m, d in demands.items() if d.waiting > 0}
    assert (chosen is None) == (not queued)
    if chosen is not None:
        assert chosen in queued
        starving = [m for m in queued if demands[m].oldest_wait_s >= POLICY.starvation_s]
        if starving:
            assert demands[chosen].oldest_wait_s == max(demands[m].oldest_wait_s for m in starving)


@settings(deadline=None)
@given(
    demands=st.dictionaries(st.sampled_from(ORDER), demand_st, max_size=3),
    first=st.sampled_from(ORDER),
    current=st.lists(st.sampled_from(ORDER), unique=True, max_size=2),
    capacity=st.floats(50, 200),
)
def test_resident_set_fits_and_keeps_the_first(
    demands: dict[str, Demand], first: str, current: list[str], capacity: float
) -> None:
    chosen = resident_set(first, current, demands, WEIGHTS, FLOORS, capacity, Q)
    assert chosen[0] == first and len(set(chosen)) == len(chosen)
    if len(chosen) > 1:
        need = sum(WEIGHTS[m] for m in chosen) + max(FLOORS[m] for m in chosen)
        assert need <= capacity
    for model in chosen[1:]:
        d = demands.get(model, Demand(0))
        assert model in current or d.waiting or d.expected_back


@settings(max_examples=60, deadline=None)
@given(
    arrivals=st.lists(
        st.tuples(st.sampled_from(ORDER), st.floats(0, 2_000)), min_size=1, max_size=60
    ),
    switch_s=st.floats(0, 20),
)
def test_starvation_bound(arrivals: list[tuple[str, float]], switch_s: float) -> None:
    """Slots chosen by ``next_model_by_demand`` and sized by ``slot_length_s``, each serving
    its model's whole queue: no call waits longer than S + (M − 1) × (Qmax + W) for its
    model's slot (the bound in the docstring, with no drain)."""
    pending = sorted(arrivals, key=lambda a: a[1])
    queues: dict[str, list[float]] = {m: [] for m in ORDER}
    now, active = 0.0, None
    bound = POLICY.starvation_s + (len(ORDER) - 1) * (POLICY.max_slot_s + switch_s)
    while pending or any(queues.values()):
        while pending and pending[0][1] <= now:
            model, at = pending.pop(0)
            queues[model].append(at)
        demands = {m: Demand(len(q), 0, now - q[0] if q else 0.0) for m, q in queues.items()}
        chosen = next_model_by_demand(ORDER, active, demands, POLICY)
        if chosen is None:
            now = pending[0][1]
            continue
        start = now + (switch_s if chosen != active else 0.0)
        for at in queues[chosen]:
            assert start - at <= bound + 1e-6
        queues[chosen] = []
        active = chosen
        now = start + slot_length_s(chosen, demands, POLICY)


@pytest.mark.parametrize(
    ("others_busy", "expected"),
    [(0, 0.050), (1, 0.010 + 2 * 0.040), (2, 0.010 + 3 * 0.040)],
)
def test_device_share_stretches_device_time_only(others_busy: int, expected: float) -> None:
    """t' = t_host + (t − t_host) × (1 + k): a 50 ms step with 10 ms of host time."""
    share = DeviceShare()
    for i in range(others_busy):
        share.set_busy(f"other{i}", True, asyncio.Event())
    assert share.stretch("me", 0.050, 0.010) == pytest.approx(expected)


def test_device_share_wakes_the_other_busy_engines() -> None:
    share = DeviceShare()
    a, b = asyncio.Event(), asyncio.Event()
    share.set_busy("a", True, a)
    share.set_busy("b", True, b)
    assert a.is_set() and not b.is_set()
    a.clear()
    share.set_busy("b", False, b)
    assert a.is_set() and share.others_busy("a") == 0


# -- the node ------------------------------------------------------------------------------------
def _small(name: str) -> ModelSpec:
    """A test model with a 10K-token window: a 10 GB KV floor, so two fit in 100 GB."""
    return replace(tiny_model(name), context_window_tokens=10_000)


SMALL = Catalog(
    models={m: _small(m) for m in ORDER},
    servers={"tiny": SERVER},
    profiles={"tiny": PROFILE},
)


def _request(session: str, model: str, i: int = 0, final: bool = True) -> CallRequest:
    return CallRequest(
        request_id=f"{session}/{i}",
        session_key=session,
        model=model,
        prompt_tokens=1000,
        max_output_tokens=200,
        call_index=i,
        session_final=final,
    )


def _run(
    flags: SchedulerFlags, requests: list[tuple[float, CallRequest]], models: tuple[str, ...]
) -> tuple[NodeScheduler, list[CallResult], list[int]]:
    """Submit each request at its time; also sample how many models are active every 0.5 s."""

    async def main() -> tuple[NodeScheduler, list[CallResult], list[int]]:
        clock = LoopClock()
        node = build_node(
            "n0", NodeSetup("tiny", "tiny", models), SMALL, flags, SchedulerConfig(30.0), clock
        )
        node.start()
        resident: list[int] = []

        async def one(at: float, request: CallRequest) -> CallResult:
            await clock.sleep(at)
            return await node.submit(request)

        async def sample() -> None:
            while True:
                resident.append(sum(e.active for e in node.engines.values()))
                assert node.memory.hbm_used_bytes <= node.memory.hbm_capacity_bytes
                await clock.sleep(0.5)

        sampler = asyncio.get_running_loop().create_task(sample())
        results = await asyncio.gather(*(one(at, r) for at, r in requests))
        sampler.cancel()
        await node.stop()
        return node, list(results), resident

    return run_virtual(main())


def test_two_models_that_fit_serve_together_without_a_switch() -> None:
    calls = [(0.0, _request("s1", "a")), (0.0, _request("s2", "b"))]
    node, (ra, rb), resident = _run(replace(ROUND, co_residency=True), calls, ("a", "b"))
    assert max(resident) == 2
    assert [s.activated for s in node.slots] == [("a", "b")]  # two cold loads, no switch
    assert ra.admitted_s < rb.finished_s and rb.admitted_s < ra.finished_s  # concurrent
    _, (_, rb0), resident0 = _run(ROUND, calls, ("a", "b"))
    assert max(resident0) == 1
    assert rb.finished_s < rb0.finished_s  # b did not wait for a's slot and a switch


def test_concurrent_decode_pays_the_shared_device_time() -> None:
    """With a and b both resident (warmed at 0 s), two calls decoding together each take
    t_host + 2 × (t − t_host) per step (DeviceShare), i.e. (0.01 + 2 × 0.041) / 0.051 ≈ 1.8×
    the decode time of a call alone."""
    flags = replace(ROUND, co_residency=True)
    warm = [(0.0, _request("w1", "a")), (0.0, _request("w2", "b"))]
    _, results, _ = _run(flags, [*warm, (30.0, _request("s", "a"))], ("a", "b"))
    alone = results[-1]
    _, results, _ = _run(
        flags, [*warm, (30.0, _request("s1", "a")), (30.0, _request("s2", "b"))], ("a", "b")
    )
    decode_alone = alone.finished_s - alone.first_token_s
    for shared in results[-2:]:
        ratio = (shared.finished_s - shared.first_token_s) / decode_alone
        assert ratio == pytest.approx((0.01 + 2 * 0.041) / 0.051, rel=0.02)


def test_third_model_that_does_not_fit_is_switched_and_memory_holds() -> None:
    """a, b, c: any two fit, three do not. Calls to all three all finish, never more than two
    models are active, and HBM never goes over capacity (sampled, and NodeMemory raises)."""
    calls = [(float(t), _request(f"{m}{t}", m)) for t in range(0, 40, 4) for m in ORDER]
    node, results, resident = _run(TALARIA, calls, ORDER)
    assert len(results) == len(calls)
    assert max(resident) == 2
    activated = [m for s in node.slots for m in s.activated]
    assert set(activated) == set(ORDER)


def test_demand_score_formula() -> None:
    assert demand_score(Demand(2, 1, 30.0), 60.0) == pytest.approx(3 * 1.5)


def test_status_counts_the_sessions_living_on_the_node() -> None:
    """A session between calls (in a tool gap) lives on the node until it ends, or until it
    has been idle ``stale_after_quanta`` quanta; routing reads the count per model."""

    async def main() -> list[dict[str, int]]:
        clock = LoopClock()
        node = build_node(
            "n0", NodeSetup("tiny", "tiny", ("a", "b")), SMALL, TALARIA, SchedulerConfig(30.0),
            clock,
        )  # fmt: skip
        node.start()
        seen = []

        def live() -> dict[str, int]:
            return {m: r.live_sessions for m, r in node.status().models.items()}

        await node.submit(_request("s1", "a", final=False))
        await node.submit(_request("s2", "b", final=False))
        seen.append(live())
        node.end_session("s2")
        seen.append(live())
        await clock.sleep(10 * 30.0 + 1)  # s1 idle past the stale window
        seen.append(live())
        await node.stop()
        return seen

    assert run_virtual(main()) == [{"a": 1, "b": 1}, {"a": 1, "b": 0}, {"a": 0, "b": 0}]
