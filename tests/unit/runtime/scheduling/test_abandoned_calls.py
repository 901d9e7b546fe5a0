"""Calls whose client goes away at any point of their life on a node (the 660 s finding).

A killed client's calls are abandoned: the proxy closes each call's node stream, the node
cancels its serving task, the engine aborts the generation. Each test below failed before the
fix it names: the generation ran on (and its end killed the engine's step task, stranding the
engine's other calls), the node was never told of its end (a call waiting for that drain
waited for the next unrelated event: a session's idle end), or a pin outlived its reservation.
The property at the end: for any calls and departures, once every call has ended the node
holds no pin, no reservation and no running call, and ending the sessions frees all KV.

All on the virtual-time loop (no wall-clock sleeps); the property is seeded by hypothesis.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock, run_virtual
from talaria.core.types import CallRequest, Finished, GenerationEvent
from talaria.runtime.engine import Admission
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import TALARIA
from talaria.runtime.scheduling.node import NodeScheduler
from talaria.runtime.sim_node import NodeSetup, build_sim_node

CATALOG = load_catalog()
GLM = "glm-4.5-fp8"
BIG = "qwen3-235b-a22b-bf16"
CODER = "qwen3-coder-480b-a35b-fp8"
"""BIG and CODER are never resident together on h200x8: a call of one waits for the other's
calls to drain. CODER's full 262,144-token window is 66.6 GB of KV: 8 such calls fit."""
QUANTUM_S = 60.0


def _node(models: tuple[str, ...]) -> NodeScheduler:
    setup = NodeSetup("h200x8", "default", models)
    node = build_sim_node("n0", setup, CATALOG, TALARIA, SchedulerConfig(), LoopClock())
    node.start()
    return node


def _leave_on_admission(node: NodeScheduler, leaving: Callable[[CallRequest], None]) -> None:
    """Call ``leaving(request)`` as each engine admits a call, in the very step of the node's
    loop that admits it (before its serving task has run): a client that goes away then."""
    for engine in node.engines.values():
        admit = engine.try_admit

        def try_admit(
            request: CallRequest,
            arrival_s: float,
            sp_admitted: bool,
            admit: Callable[[CallRequest, float, bool], Admission | None] = admit,
        ) -> Admission | None:
            admission = admit(request, arrival_s, sp_admitted)
            if admission is not None:
                leaving(request)
            return admission

        engine.try_admit = try_admit  # type: ignore[method-assign]


async def _settle(clock: LoopClock) -> None:
    """Let the node run a moment (virtual time)."""
    await clock.sleep(0.001)


def test_non_streaming_call_left_mid_decode_is_aborted_and_spares_the_engine() -> None:
    """Before: a consumer cancelled while awaiting a non-streaming call's result cancelled the
    engine's ``done`` future, so the stream's cleanup skipped the abort; the call generated on
    to its end, where setting the cancelled future raised in the step task: the engine's other
    call ("o", another session) was never stepped again."""

    async def main() -> tuple[int, bool, int, int]:
        clock = LoopClock()
        node = _node((GLM,))
        engine = node.engines[GLM]
        other = asyncio.create_task(node.submit(CallRequest("o", "s0", GLM, 500, 3000)))
        stream = node.stream(CallRequest("a", "s1", GLM, 500, 2000))
        await anext(stream)  # FirstToken: it decodes now
        reader = asyncio.create_task(anext(stream))  # waits for its result
        await clock.sleep(1.0)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await stream.aclose()
        await _settle(clock)
        running = engine.running
        done, _ = await asyncio.wait([other], timeout=600)
        pins = node.memory.kv["s1"].pins
        await node.stop()
        return running, bool(done), engine.running, pins

    assert run_virtual(main()) == (1, True, 0, 0)


def test_call_left_in_the_step_that_admits_it_is_aborted_and_drains() -> None:
    """Before: its serving task was cancelled before its first step, so its body never ran:
    the engine generated all 30,000 tokens on, the call stayed pending on the node, and when it
    ended nothing woke the node. A call of the other model, which needs that drain, waited for
    the next unrelated event (here: none for an hour; live: a session's idle end, 600 s)."""

    async def main() -> tuple[int, int, int, float]:
        clock = LoopClock()
        node = _node((BIG, CODER))
        gone: list[asyncio.Task[list[GenerationEvent]]] = []

        async def consume(request: CallRequest) -> list[GenerationEvent]:
            async with contextlib.aclosing(node.stream(request)) as stream:
                return [event async for event in stream]

        def leaving(request: CallRequest) -> None:
            if request.request_id == "a":
                gone[0].cancel()

        _leave_on_admission(node, leaving)
        gone.append(asyncio.create_task(consume(CallRequest("a", "s1", BIG, 500, 30_000))))
        await asyncio.gather(*gone, return_exceptions=True)
        await _settle(clock)
        running = node.engines[BIG].running
        pins = node.memory.kv["s1"].pins
        live = node.status().models[BIG].live_sessions
        asked = clock.now()
        other = asyncio.create_task(node.submit(CallRequest("b", "s2", CODER, 500, 10)))
        await asyncio.wait([other], timeout=3600)
        served_in_s = other.result().finished_s - asked if other.done() else math.inf
        await node.stop()
        return running, pins, live, served_in_s

    running, pins, live, served_in_s = run_virtual(main())
    assert (running, pins, live) == (0, 0, 0)
    assert served_in_s < QUANTUM_S  # a switch (its weights' wake), not an hour


def test_two_calls_of_one_session_leave_one_pin_per_reservation() -> None:
    """Before: the second call's reservation replaced the first's and pinned the KV again, so
    one pin outlived both reservations: the session's KV stayed pinned in HBM for good, even
    after the session ended (``end_session`` keeps pinned KV)."""

    async def main() -> tuple[int, int, bool, float]:
        clock = LoopClock()
        node = _node((GLM,))
        await node.submit(CallRequest("r0", "s1", GLM, 500, 20))
        await asyncio.gather(
            node.submit(CallRequest("a", "s1", GLM, 1000, 20)),
            node.submit(CallRequest("b", "s1", GLM, 1000, 40)),
        )
        held = node.memory.kv["s1"].pins
        await clock.sleep(3600)  # every reservation expired
        after = node.memory.kv["s1"].pins
        node.end_session("s1")
        kept = "s1" in node.memory.kv
        kv_bytes = node.memory.hbm_kv_bytes
        await node.stop()
        return held, after, kept, kv_bytes

    assert run_virtual(main()) == (1, 0, False, 0.0)


def test_a_sessions_short_call_keeps_the_kv_its_long_call_holds() -> None:
    """Two calls of one session share its KV entry. Before: the short call's admission
    replaced the entry by its own size while the long call ran, so the long call's KV was
    counted free and given to others; at the long call's end the node went over its HBM
    (``CapacityError`` in the engine's step task; the property below found it)."""

    async def main() -> tuple[int, int]:
        node = _node((GLM,))
        long = node.stream(CallRequest("a", "s1", GLM, 100_000, 2_000))
        await anext(long)  # prefilled, decoding
        short = node.stream(CallRequest("b", "s1", GLM, 500, 10))
        await anext(short)
        while_both = node.memory.kv["s1"].tokens
        rest = [e async for e in short] + [e async for e in long]
        assert isinstance(rest[-1], Finished)
        await node.stop()
        return while_both, node.memory.kv["s1"].tokens

    while_both, after = run_virtual(main())
    assert while_both == 100_000 + 2_000  # the long call's commitment
    assert after == 100_000 + 2_000  # the last to finish: its prompt + output


@dataclass(frozen=True)
class _Call:
    session: int
    model: str
    prompt_tokens: int
    output_tokens: int
    stream: bool
    arrival_s: float
    gap_hint_s: float | None
    leave: tuple[float, int] | None
    """The client goes away this long after the call arrived, then this many loop steps
    later; None: it stays."""
    leave_on_admission: bool
    """The client goes away in the very step that admits the call (wins over ``leave``)."""


_calls = st.builds(
    _Call,
    session=st.integers(0, 5),
    model=st.sampled_from((BIG, CODER)),
    prompt_tokens=st.sampled_from((500, 4_000, 60_000, 120_000)),
    output_tokens=st.integers(1, 2_000),
    stream=st.booleans(),
    arrival_s=st.floats(0, 40, allow_nan=False),
    gap_hint_s=st.none() | st.floats(0, 50, allow_nan=False),
    leave=st.none() | st.tuples(st.floats(0, 60, allow_nan=False), st.integers(0, 3)),
    leave_on_admission=st.booleans(),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_calls, min_size=1, max_size=12))
def test_any_departures_leave_no_pin_reservation_or_running_call(calls: list[_Call]) -> None:
    """For any calls (two models that never share the node, prompts up to 120,000 tokens so
    calls wait for memory and for drains, hints that reserve) and clients that go away at any
    point (queued, in the step that admits them, in the intake, prefill or decode, or never):
    once every call has ended and the reservations' time is up, no KV is pinned, no
    reservation or call is left, no session counts a call pending, and ending every session
    frees all the KV. Every call whose client stayed got its ``Finished``."""

    async def main() -> None:
        clock = LoopClock()
        node = _node((BIG, CODER))
        tasks: dict[str, asyncio.Task[list[GenerationEvent]]] = {}
        plans = {f"r{i}": call for i, call in enumerate(calls)}

        def on_admission(request: CallRequest) -> None:
            call = plans.get(request.request_id)
            if call is not None and call.leave_on_admission:
                tasks[request.request_id].cancel()

        _leave_on_admission(node, on_admission)

        got: dict[str, list[GenerationEvent]] = {}

        async def consume(request_id: str, call: _Call) -> list[GenerationEvent]:
            await clock.sleep(call.arrival_s)
            request = CallRequest(
                request_id,
                f"s{call.session}",
                call.model,
                call.prompt_tokens,
                call.output_tokens,
                expected_tool_gap_s=call.gap_hint_s,
                stream=call.stream,
            )
            events = got.setdefault(request_id, [])
            async with contextlib.aclosing(node.stream(request)) as stream:
                async for item in stream:
                    events.append(item)
            return events

        async def leave(request_id: str, after_s: float, steps: int) -> None:
            await clock.sleep(after_s)
            for _ in range(steps):
                await asyncio.sleep(0)
            tasks[request_id].cancel()

        leavers = []
        for request_id, call in plans.items():
            tasks[request_id] = asyncio.create_task(consume(request_id, call))
            if call.leave is not None and not call.leave_on_admission:
                after_s, steps = call.leave
                at_s = call.arrival_s + after_s
                leavers.append(asyncio.create_task(leave(request_id, at_s, steps)))
        await asyncio.gather(*tasks.values(), *leavers, return_exceptions=True)
        for request_id, task in tasks.items():
            call = plans[request_id]
            if call.leave is None and not call.leave_on_admission:
                assert isinstance(task.result()[-1], Finished), request_id
            elif task.cancelled():  # where the client left (hypothesis' statistics)
                seen = got.get(request_id)
                where = "before its arrival" if seen is None else f"after {len(seen)} events"
                event(f"left {where}")
        await clock.sleep(3600)  # reservations (≤ 2 × 50 s) and slots run out

        status = node.status()
        assert [e.running for e in node.engines.values()] == [0, 0]
        assert node.holds.live == {}
        assert {key: e.pins for key, e in node.memory.kv.items() if e.pins} == {}
        assert sum(m.live_sessions for m in status.models.values()) == 0  # none pending
        for session in {f"s{call.session}" for call in calls}:
            node.end_session(session)
        assert node.memory.kv == {}
        assert math.isclose(node.memory.hbm_kv_bytes, 0.0, abs_tol=1.0)
        await node.submit(CallRequest("after", "s-after", CODER, 500, 10))  # it still serves
        await node.stop()

    run_virtual(main())
