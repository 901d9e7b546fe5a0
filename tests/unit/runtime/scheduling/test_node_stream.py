"""NodeScheduler.stream: token deltas for streaming calls, and a consumer that leaves early."""

from __future__ import annotations

import asyncio

from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock, run_virtual
from talaria.core.holds import ReleaseReason
from talaria.core.types import CallRequest, Finished, FirstToken, TokenDelta
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import TALARIA
from talaria.sim.replay import NodeSetup, build_node

CATALOG = load_catalog()
SETUP = NodeSetup("h200x8", "default", ("glm-4.5-fp8", "gpt-oss-120b"))


def _node(clock: LoopClock):  # type: ignore[no-untyped-def]
    node = build_node("n0", SETUP, CATALOG, TALARIA, SchedulerConfig(), clock)
    node.start()
    return node


def test_streaming_call_yields_deltas_that_add_up_to_its_output() -> None:
    async def main() -> list[object]:
        node = _node(LoopClock())
        request = CallRequest("r1", "s1", "glm-4.5-fp8", 2000, 50, stream=True)
        events = [e async for e in node.stream(request)]
        await node.stop()
        return events

    events = run_virtual(main())
    assert isinstance(events[0], FirstToken)
    assert isinstance(events[-1], Finished)
    deltas = [e for e in events if isinstance(e, TokenDelta)]
    assert 1 + sum(d.tokens for d in deltas) == events[-1].result.output_tokens == 50
    times = [d.t_s for d in deltas]
    assert times == sorted(times) and len(deltas) >= 50 // 8  # woken at least every 8 steps


def test_non_streaming_call_through_stream_gets_first_token_and_result_only() -> None:
    async def main() -> list[object]:
        node = _node(LoopClock())
        events = [e async for e in node.stream(CallRequest("r1", "s1", "glm-4.5-fp8", 500, 20))]
        await node.stop()
        return events

    kinds = [type(e) for e in run_virtual(main())]
    assert kinds == [FirstToken, Finished]


def test_consumer_leaving_before_admission_removes_the_call() -> None:
    async def main() -> tuple[int, int]:
        node = _node(LoopClock())
        # glm is woken first; a gpt-oss call waits for its slot behind a long glm call
        first = asyncio.create_task(node.submit(CallRequest("a", "s1", "glm-4.5-fp8", 500, 400)))
        await asyncio.sleep(0.1)
        stream = node.stream(CallRequest("b", "s2", "gpt-oss-120b", 500, 20))
        waiter = asyncio.create_task(anext(stream))  # type: ignore[arg-type]
        await asyncio.sleep(0.1)
        queued = node.waiting_counts()["gpt-oss-120b"]
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        await stream.aclose()
        left = node.waiting_counts()["gpt-oss-120b"]
        await first
        await node.stop()
        return queued, left

    assert run_virtual(main()) == (1, 0)


def test_consumer_leaving_after_admission_stops_the_generation() -> None:
    """A client gone mid-reply (the runtime server closes the call's stream): the engine stops
    generating it at once, instead of running its 8,000 output tokens on (issue 26)."""

    async def main() -> tuple[int, float, float, int]:
        clock = LoopClock()
        node = _node(clock)
        stream = node.stream(CallRequest("a", "s1", "glm-4.5-fp8", 500, 8000, stream=True))
        await anext(stream)  # FirstToken: admitted and generating
        running = node.engines["glm-4.5-fp8"].running
        left_at = clock.now()
        await stream.aclose()
        # the next call runs at once: the engine is not busy with the abandoned one
        done = await node.submit(CallRequest("b", "s2", "glm-4.5-fp8", 500, 10))
        await node.stop()
        return running, left_at, done.finished_s, node.engines["glm-4.5-fp8"].running

    running, left_at, next_done, after = run_virtual(main())
    assert (running, after) == (1, 0)
    assert next_done - left_at < 5.0  # 8,000 tokens of decode would take minutes


def test_session_moved_releases_its_reservation_but_keeps_its_kv() -> None:
    async def main() -> tuple[int, int, bool]:
        node = _node(LoopClock())
        await node.submit(CallRequest("r1", "s1", "glm-4.5-fp8", 2000, 20))
        live_before = len(node.holds.live)
        node.session_moved("s1")
        moved = node.holds.released[ReleaseReason.MOVED]
        kept = "s1" in node.memory.kv and not node.memory.kv["s1"].pinned
        await node.stop()
        return live_before, moved, kept

    assert run_virtual(main()) == (1, 1, True)
