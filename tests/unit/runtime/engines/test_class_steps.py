"""The fair queue's rule 5 (runtime/engine.py ``class_steps``, runtime/engines/sim_steps.py):
lower-class calls already running yield an engine's iterations to a higher class while they
would slow its steps past ``class_slowdown``, each preempted at most ``preempt_limit`` times.

Table-driven for the pure rule; on the simulated engine (virtual time), hypothesis: every call
finishes, none is preempted more than the limit, one class is never preempted, the outcome
does not depend on when the engine's loop is woken (a co-resident engine's busy changes wake
it: rule 5 decides when a call joins or leaves the steps, as on vLLM), and an interactive call
beside a running batch finishes sooner with the rule than without."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock, run_virtual
from talaria.core.types import CallRequest, Finished, Priority
from talaria.runtime.costmodel import CostModel
from talaria.runtime.engine import ClassStepRule, class_steps
from talaria.runtime.engines.sim import SimEngine
from talaria.runtime.engines.sim_steps import SimSeq
from talaria.runtime.memory.resources import DeviceShare, NodeMemory, PcieLink


@dataclass(frozen=True)
class Call:
    name: str
    rank: int
    work: float  # what it adds to an iteration's time
    preempted: int = 0


def _step_s(calls: list[Call] | tuple[Call, ...]) -> float:
    return 1.0 + sum(c.work for c in calls)  # a fixed part and each call's share


def _chosen(ready: list[Call], slowdown: float = 1.2, limit: int = 3) -> list[str]:
    picked = class_steps(ready, lambda c: c.rank, lambda c: c.preempted, _step_s, slowdown, limit)
    return [c.name for c in picked]


@pytest.mark.parametrize(
    ("ready", "expected"),
    [
        ([], []),
        # one class: everyone, whatever it costs
        ([Call("a", 1, 5.0), Call("b", 1, 5.0)], ["a", "b"]),
        # the interactive call alone costs 1.1; 1.2 × 1.1 = 1.32 leaves room for 0.22 more
        ([Call("bulk", 1, 0.2), Call("ide", 0, 0.1)], ["bulk", "ide"]),
        ([Call("bulk", 1, 0.3), Call("ide", 0, 0.1)], ["ide"]),
        # lower classes in class order, then admission order, while they fit
        (
            [Call("b1", 2, 0.1), Call("s1", 1, 0.15), Call("ide", 0, 0.1), Call("s2", 1, 0.1)],
            ["s1", "ide"],
        ),
        # a call preempted the limit times takes every step
        ([Call("bulk", 1, 5.0, preempted=3), Call("ide", 0, 0.1)], ["bulk", "ide"]),
        ([Call("bulk", 1, 5.0, preempted=2), Call("ide", 0, 0.1)], ["ide"]),
        # only lower classes ready: the best of them is the class that steps
        ([Call("b", 2, 5.0), Call("s", 1, 0.1)], ["s"]),
    ],
)
def test_which_calls_take_the_next_iteration(ready: list[Call], expected: list[str]) -> None:
    assert _chosen(ready) == expected


@given(
    st.lists(st.tuples(st.integers(0, 2), st.floats(0.0, 2.0), st.integers(0, 4)), max_size=12),
    st.floats(1.0, 2.0),
    st.integers(0, 4),
)
def test_the_rule_keeps_the_best_class_and_its_bound(
    spec: list[tuple[int, float, int]], slowdown: float, limit: int
) -> None:
    ready = [Call(f"c{i}", r, w, p) for i, (r, w, p) in enumerate(spec)]
    picked = class_steps(ready, lambda c: c.rank, lambda c: c.preempted, _step_s, slowdown, limit)
    assert picked == [c for c in ready if c in picked]  # admission order
    if not ready:
        return
    best = min(c.rank for c in ready)
    forced = [c for c in ready if c.rank == best or c.preempted >= limit]
    assert all(c in picked for c in forced)
    optional = [c for c in picked if c not in forced]
    if optional:  # what it adds beyond the forced calls stays within the bound
        assert _step_s(picked) <= slowdown * _step_s([c for c in ready if c.rank == best])


# -- on the simulated engine ----------------------------------------------------------------
CATALOG = load_catalog()
SERVER = CATALOG.server("h200x8")
MODEL = CATALOG.model("glm-4.5-fp8")
PRIORITIES = (Priority.INTERACTIVE, Priority.STANDARD, Priority.BATCH)


def _engine(
    clock: LoopClock, rule: ClassStepRule | None, device: DeviceShare | None = None
) -> tuple[SimEngine, list[SimSeq]]:
    engine = SimEngine(
        MODEL, CostModel(MODEL, SERVER, CATALOG.profile("default")),
        NodeMemory(SERVER.usable_hbm_bytes, 0.0), PcieLink(clock), clock, "n0", host_kv=False,
        device=device,
    )  # fmt: skip
    engine.step_by_class(rule)
    seen: list[SimSeq] = []
    steps = engine._steps  # every sequence the engine takes, for the counts
    add = steps.add

    def record(seq: SimSeq, transfer_bytes: float, intake_s: float) -> None:
        seen.append(seq)
        add(seq, transfer_bytes, intake_s)

    steps.add = record  # type: ignore[method-assign]
    return engine, seen


Arrival = tuple[float, int, int, int]  # at (s), class rank, prompt tokens, output tokens


async def _serve(engine: SimEngine, clock: LoopClock, arrivals: list[Arrival]) -> dict[str, float]:
    """Each call admitted at its time and read to its end; its finish time by name."""
    await engine.activate()
    finished: dict[str, float] = {}

    async def one(i: int, at: float, rank: int, prompt: int, output: int) -> None:
        await clock.sleep(at)
        request = CallRequest(
            f"r{i}", f"s{i}", MODEL.name, prompt, output, output_tokens=output,
            priority=PRIORITIES[rank],
        )  # fmt: skip
        admission = engine.try_admit(request, clock.now(), sp_admitted=False)
        assert admission is not None
        async for event in engine.run(admission):
            if isinstance(event, Finished):
                finished[request.request_id] = event.result.finished_s

    await asyncio.gather(*(one(i, *a) for i, a in enumerate(arrivals)))
    return finished


arrivals = st.lists(
    st.tuples(
        st.floats(0.0, 20.0), st.integers(0, 2), st.integers(100, 20_000), st.integers(1, 400)
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals, st.integers(0, 3))
def test_every_call_finishes_and_none_is_preempted_past_the_limit(
    calls: list[Arrival], limit: int
) -> None:
    clock = LoopClock()
    engine, seen = _engine(clock, ClassStepRule(1.2, limit))
    finished = run_virtual(_serve(engine, clock, calls))
    assert len(finished) == len(calls)
    assert all(seq.preempted <= limit for seq in seen)
    assert engine.preemptions == sum(seq.preempted for seq in seen)
    if len({rank for _, rank, _, _ in calls}) == 1:
        assert engine.preemptions == 0  # one class: never


def _served_with_wakes(
    calls: list[Arrival], wakes: list[float], limit: int
) -> tuple[dict[str, float], int]:
    """Each call's finish time and the engine's preemptions, with a co-resident engine that
    turns busy and idle again at each of ``wakes`` (each turn wakes this engine's loop, and
    leaves its step times as they were)."""
    clock = LoopClock()
    device = DeviceShare()
    engine, _ = _engine(clock, ClassStepRule(1.2, limit), device)

    async def wake_at(at: float) -> None:
        await clock.sleep(at)
        device.set_busy("other", True, asyncio.Event())
        device.set_busy("other", False, asyncio.Event())

    async def serve() -> dict[str, float]:
        tasks = [asyncio.ensure_future(wake_at(at)) for at in wakes]
        finished = await _serve(engine, clock, calls)
        await asyncio.gather(*tasks)
        return finished

    return run_virtual(serve()), engine.preemptions


centi_arrivals = st.lists(
    st.tuples(
        st.integers(0, 2000), st.integers(0, 2), st.integers(100, 20_000), st.integers(1, 2000)
    ),
    min_size=1,
    max_size=25,
    unique_by=lambda a: a[0],
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(centi_arrivals, st.lists(st.integers(0, 20_000), max_size=30), st.integers(0, 3))
@example([(367, 0, 100, 5), (368, 1, 100, 1)], [785], 1)  # held once per iteration, not per call
def test_the_outcome_does_not_depend_on_when_the_loop_is_woken(
    at_centis: list[tuple[int, int, int, int]], wake_centis: list[int], limit: int
) -> None:
    """The same calls with and without a co-resident engine's wakes: every call finishes at
    the same time, and as many are held. Arrivals come on a 10 ms grid and wakes between its
    points: asyncio runs timers due at the same time in its heap's order, which an extra
    timer changes."""
    calls = [(at / 100, rank, prompt, output) for at, rank, prompt, output in at_centis]
    alone, preempted = _served_with_wakes(calls, [], limit)
    woken, preempted_woken = _served_with_wakes(
        calls, [(c + 0.5) / 100 for c in wake_centis], limit
    )
    assert preempted_woken == preempted
    assert woken.keys() == alone.keys()
    for request_id, finished_s in alone.items():
        assert woken[request_id] == pytest.approx(finished_s, rel=1e-9, abs=1e-9)


def test_an_interactive_call_beside_a_running_batch_finishes_sooner_with_the_rule() -> None:
    """Eight bulk calls with long prompts are running when an interactive call arrives: without
    the rule their prefill chunks and decodes share its every step."""
    bulk = [(0.0, 1, 30_000, 800) for _ in range(8)]
    calls = [*bulk, (0.5, 0, 2_000, 200)]
    ends = {}
    for rule in (None, ClassStepRule(1.2, 3)):
        clock = LoopClock()
        engine, _ = _engine(clock, rule)
        ends[rule is not None] = run_virtual(_serve(engine, clock, calls))
    ide = f"r{len(bulk)}"
    assert ends[True][ide] < ends[False][ide]
    # the bulk calls finish anyway (later or not)
    assert len(ends[True]) == len(calls)
