"""Sessions through the real Gateway, on the virtual clock: soft reservations, idle ends,
children, and tenants that never share a session or its cached prefix."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from talaria.core.calls import Call, ToolChoice, ToolSpec
from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock, run_virtual
from talaria.core.gap_model import DEFAULT_GAP_PRIOR_S
from talaria.core.types import CallResult, EngineTimes, KvSource
from talaria.proxy.callpath.gateway import CallPath, call_path
from talaria.proxy.callpath.recorder import engine_parts
from talaria.proxy.cluster.handoff import AdoptableSession
from talaria.proxy.contract.calls import PreparedCall
from talaria.proxy.contract.identity import Identity
from talaria.proxy.contract.metrics import ProxyMetrics
from talaria.proxy.contract.records import CallRecord, ReservationRecord, SessionRecord
from talaria.proxy.runtimes.embedded import InProcessRuntime
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import TALARIA
from talaria.runtime.sim_node import NodeSetup, build_sim_node
from tests.support import ListSink

MODEL = "glm-4.5-fp8"


BASH = ToolSpec("bash", "run a command", {"type": "object", "properties": {}})


def _call(
    n: int,
    sid: str | None = "s1",
    tool: bool = True,
    gap_s: float | None = None,
    tenant: str = "t",
    task: str = "fix the bug ",
    parent: str | None = None,
) -> PreparedCall:
    """Call ``n`` of a conversation: the task, then ``n`` earlier steps (a tool call and its
    result) — so each call continues the one before."""
    messages: list[dict[str, object]] = [{"role": "user", "content": task * 50}]
    for k in range(n):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": f"output {k}"})
    return PreparedCall(
        request_id=f"r{n}-{tenant}-{sid}-{task[:8]}",
        tenant_id=tenant,
        identity=Identity(sid, "talaria" if sid else "implicit", parent, gap_s, False),
        api="chat",
        content=Call(
            model=MODEL,
            messages=tuple(messages),
            tools=(BASH,) if tool else (),
            tool_choice=ToolChoice("required") if tool else ToolChoice("auto"),
        ),
        max_tokens=64,
    )


def _run(
    scenario: Callable[[CallPath, LoopClock], Awaitable[None]],
    idle_timeout_s: float = 600.0,
    time_scale: float = 1.0,
) -> tuple[ListSink, str]:
    sink = ListSink()
    metrics = ProxyMetrics()

    async def main() -> None:
        clock = LoopClock()
        node = build_sim_node(
            "n0", NodeSetup("h200x8", "default", (MODEL,)), load_catalog(), TALARIA,
            SchedulerConfig(), clock,
        )  # fmt: skip
        runtime = InProcessRuntime(node, clock, status_ttl_s=0.0)
        await runtime.start()
        path = call_path(
            [runtime],
            sink,
            metrics,
            clock,
            session_idle_timeout_s=idle_timeout_s,
            time_scale=time_scale,
        )
        path.gateway.start()
        try:
            await scenario(path, clock)
        finally:
            await path.gateway.close()
            await runtime.close()

    run_virtual(main())
    return sink, metrics.render().decode()


def _metric(text: str, outcome: str) -> float:
    line = f'talaria_reservations_total{{outcome="{outcome}"}}'
    found = [float(x.split()[-1]) for x in text.splitlines() if x.startswith(line)]
    return found[0] if found else 0.0


def test_a_session_that_returns_in_time_hits_its_reservation() -> None:
    async def scenario(path: CallPath, clock: LoopClock) -> None:
        outcome = await (await path.gateway.open_call(_call(0))).outcome()
        assert outcome.output.finish_reason == "tool_calls"
        await clock.sleep(1.0)
        handle = await path.gateway.open_call(_call(1))
        assert handle.instance == "n0"
        await handle.outcome()

    sink, metrics = _run(scenario)
    first = [
        r for r in sink.reservations() if r.reservation_id == sink.reservations()[0].reservation_id
    ]
    assert [r.release_reason for r in first] == [None, "returned"]
    assert _metric(metrics, "hit") == 1 and _metric(metrics, "taken") == 2
    # expected return = the prior gap (no hint, nothing learned yet)
    taken = first[0]
    assert (taken.expected_return_at - taken.created_at).total_seconds() == pytest.approx(
        DEFAULT_GAP_PRIOR_S
    )


def test_each_thread_holds_its_own_reservation() -> None:
    """A side conversation under the session's id (thread 1) runs while the main one (thread
    0) is in its tool gap: the main thread's reservation stays held, and its return hits it."""

    async def scenario(path: CallPath, clock: LoopClock) -> None:
        await (await path.gateway.open_call(_call(0))).outcome()  # thread 0 reserves
        side = await path.gateway.open_call(_call(0, task="write a title "))
        assert side.how == "thread"
        await side.outcome()  # thread 1 reserves its own
        state = path.keeper.sessions.named("t", "s1")
        assert state is not None
        assert [t.preference is not None for t in state.threads.values()] == [True, True]
        assert path.keeper.preferences.held(state.key) is not None
        assert path.keeper.preferences.held(state.runtime_key(1)) is not None
        await clock.sleep(1.0)
        await (await path.gateway.open_call(_call(1))).outcome()  # the main thread comes back

    sink, metrics = _run(scenario)
    by_id: dict[str, list[str | None]] = {}
    for r in sink.reservations():
        by_id.setdefault(r.reservation_id, []).append(r.release_reason)
    # thread 0's first returned (a hit); thread 1's is still held; the return took a new one
    assert sorted(map(tuple, by_id.values())) == [(None,), (None,), (None, "returned")]
    assert _metric(metrics, "hit") == 1


def test_a_final_call_ends_every_thread_of_the_session_on_the_runtime() -> None:
    ended: list[str] = []

    async def scenario(path: CallPath, clock: LoopClock) -> None:
        runtime = path.pool["n0"]
        real = runtime.end_sessions

        async def spy(keys: Sequence[str]) -> None:
            ended.extend(keys)
            await real(keys)

        runtime.end_sessions = spy  # type: ignore[method-assign]
        await (await path.gateway.open_call(_call(0))).outcome()  # thread 0
        state = path.keeper.sessions.named("t", "s1")
        assert state is not None
        final = _call(0, task="write a title ")  # thread 1, the session's last call
        final = replace(final, identity=replace(final.identity, final=True))
        await (await path.gateway.open_call(final)).outcome()
        for _ in range(3):
            await asyncio.sleep(0)  # the task that ends the other threads
        assert ended == [state.runtime_key(0)]  # thread 1 ended with its own final call
        assert len(path.keeper.sessions) == 0

    _run(scenario)


@pytest.mark.parametrize("time_scale", [1.0, 4.0])
def test_a_calls_record_has_its_slot_wait_in_wall_seconds(time_scale: float) -> None:
    """The first call waits for its model's first slot (the node wakes it); the next one finds
    the slot open."""
    results: list[CallResult] = []

    async def scenario(path: CallPath, clock: LoopClock) -> None:
        for n in range(2):
            results.append((await (await path.gateway.open_call(_call(n))).outcome()).result)

    sink, _ = _run(scenario, time_scale=time_scale)
    first, second = results
    assert first.slot_wait_s > 0 and second.slot_wait_s == 0
    records = {r.request_id: r for r in sink.records if isinstance(r, CallRecord)}
    for result in results:
        record = records[result.request_id]
        assert record.slot_wait_s == pytest.approx(result.slot_wait_s / time_scale)
        assert record.queue_s == pytest.approx(result.queue_s / time_scale)


@pytest.mark.parametrize("time_scale", [1.0, 4.0])
def test_a_calls_engine_timed_parts_are_recorded_in_wall_seconds(time_scale: float) -> None:
    result = CallResult(
        "r", "s", "m", "n0", 10, 0, 4, arrival_s=1.0, admitted_s=2.0, first_token_s=3.5,
        finished_s=6.0, kv_source=KvSource.NEW, restored_bytes=0.0, recomputed_tokens=0,
        sp_admitted=False, engine=EngineTimes(2.5, 2.75, 3.25, 5.75),
    )  # fmt: skip
    wall = lambda s: s / time_scale  # noqa: E731
    assert engine_parts(result, wall) == {
        "engine_intake_s": 0.5 / time_scale,
        "engine_queue_s": 0.25 / time_scale,
        "engine_prefill_s": 0.5 / time_scale,
        "engine_decode_s": 2.5 / time_scale,
    }
    assert engine_parts(replace(result, engine=None), wall) == {}


def test_a_reservation_expires_when_the_session_stays_away() -> None:
    async def scenario(path: CallPath, clock: LoopClock) -> None:
        await (await path.gateway.open_call(_call(0, gap_s=2.0))).outcome()
        await clock.sleep(10.0)  # hinted 2 s: expires at max(2·2, 2 + 1) = 4 s, swept every 1 s

    sink, metrics = _run(scenario)
    assert [r.release_reason for r in sink.reservations()] == [None, "expired"]
    assert _metric(metrics, "expired") == 1
    states = [r.state for r in sink.records if isinstance(r, SessionRecord)]
    assert states[-1] == "in_tool"


def test_ending_the_session_releases_its_reservation() -> None:
    async def scenario(path: CallPath, clock: LoopClock) -> None:
        await (await path.gateway.open_call(_call(0))).outcome()
        assert await path.keeper.end_session("s1", "client", "t")
        assert not await path.keeper.end_session("s1", "client", "t")  # already ended

    sink, metrics = _run(scenario)
    assert [r.release_reason for r in sink.reservations()] == [None, "ended"]
    ended = [r for r in sink.records if isinstance(r, SessionRecord) and r.state == "ended"]
    assert ended and ended[-1].end_reason == "client"
    assert _metric(metrics, "ended") == 1


def test_no_reservation_without_a_tool_call_or_hint() -> None:
    async def scenario(path: CallPath, clock: LoopClock) -> None:
        await (await path.gateway.open_call(_call(0, tool=False))).outcome()

    sink, _ = _run(scenario)
    assert sink.reservations() == []


def test_learned_gap_sets_the_next_expected_return() -> None:
    async def scenario(path: CallPath, clock: LoopClock) -> None:
        await (await path.gateway.open_call(_call(0))).outcome()
        await clock.sleep(0.5)
        await (await path.gateway.open_call(_call(1))).outcome()

    sink, _ = _run(scenario)
    taken = [r for r in sink.reservations() if r.release_reason is None]
    second = taken[1]
    learned = (DEFAULT_GAP_PRIOR_S + 0.5) / 2  # prior (weight 1) and one observed 0.5 s gap
    assert (second.expected_return_at - second.created_at).total_seconds() == pytest.approx(
        learned, abs=1e-3
    )


def test_idle_sessions_end_by_themselves() -> None:
    async def scenario(path: CallPath, clock: LoopClock) -> None:
        await (await path.gateway.open_call(_call(0, sid=None))).outcome()
        await clock.sleep(10.0)
        assert len(path.keeper.sessions) == 1  # 10 s idle: still live
        await clock.sleep(25.0)
        assert len(path.keeper.sessions) == 0  # past the 30 s timeout: ended

    sink, _ = _run(scenario, idle_timeout_s=30.0)
    ended = [r for r in sink.records if isinstance(r, SessionRecord) and r.state == "ended"]
    assert [r.end_reason for r in ended] == ["idle"]
    assert [r.release_reason for r in sink.reservations()] == [None, "expired"]


def test_a_session_whose_only_call_was_abandoned_ends_on_the_runtime_too() -> None:
    """Its thread never got a reply, so no instance was known for it and its idle end was
    never sent to the runtime: the node kept the session and the KV of the aborted call for
    good, and was not woken by its end (the 660 s finding: a call waiting on that node for a
    drain waited until some other session's end)."""
    seen: list[tuple[bool, bool]] = []

    async def scenario(path: CallPath, clock: LoopClock) -> None:
        memory = path.pool["n0"].node.memory  # type: ignore[attr-defined]
        handle = await path.gateway.open_call(_call(0, sid=None))
        assert (await handle.events.get())[0] == "first"  # admitted, decoding
        handle.abandon()
        await asyncio.gather(handle.task, return_exceptions=True)
        seen.append((handle.session_key in memory.kv, len(path.keeper.sessions) == 1))
        await clock.sleep(35.0)  # past the 30 s idle timeout
        seen.append((handle.session_key in memory.kv, len(path.keeper.sessions) == 1))

    sink, _ = _run(scenario, idle_timeout_s=30.0)
    assert seen == [(True, True), (False, False)]
    assert [r.status for r in sink.records if isinstance(r, CallRecord)] == ["cancelled"]


def test_a_call_abandoned_before_its_task_ran_is_recorded_and_leaves_nothing_in_flight() -> None:
    """Before: the call's task was cancelled before its first step, so its body never ran: no
    record, and the session and the tenant counted the call in flight for good (the session
    could never idle out)."""
    seen: list[tuple[int, int]] = []

    async def scenario(path: CallPath, clock: LoopClock) -> None:
        handle = await path.gateway.open_call(_call(0, sid=None))
        handle.abandon()  # at once: the call's task has not run yet
        await asyncio.gather(handle.task, return_exceptions=True)
        state = path.keeper.sessions.get(handle.session_key)
        assert state is not None
        seen.append((state.inflight, path.gateway.inflight))

    sink, _ = _run(scenario)
    assert seen == [(0, 0)]
    assert [r.status for r in sink.records if isinstance(r, CallRecord)] == ["cancelled"]


def test_ending_a_session_ends_its_children() -> None:
    async def scenario(path: CallPath, clock: LoopClock) -> None:
        await (await path.gateway.open_call(_call(0))).outcome()
        thread = await path.gateway.open_call(_call(0, task="search the code "))  # same id
        assert thread.how == "thread"  # a new conversation under the id: the same session
        await thread.outcome()
        child = await path.gateway.open_call(_call(0, sid="agent-1", parent="s1", task="grep "))
        assert child.how == "child"
        await child.outcome()
        assert await path.keeper.end_session("s1", "client", "t")
        assert len(path.keeper.sessions) == 0

    sink, _ = _run(scenario)
    ended = {r.session_key: r for r in sink.records if isinstance(r, SessionRecord) and r.ended_at}
    assert len(ended) == 2 and {r.end_reason for r in ended.values()} == {"client"}
    children = [r for r in ended.values() if r.parent_session_key is not None]
    assert len(children) == 1 and children[0].parent_session_key in ended


def test_tenants_never_share_a_session_or_its_prefix() -> None:
    async def scenario(path: CallPath, clock: LoopClock) -> None:
        first = await (await path.gateway.open_call(_call(0, tenant="A"))).outcome()
        again = await (await path.gateway.open_call(_call(1, tenant="A"))).outcome()
        other = await path.gateway.open_call(_call(1, tenant="B"))  # B replays A's conversation
        stranger = await other.outcome()
        assert first.result.session_key == again.result.session_key
        assert stranger.result.session_key != first.result.session_key
        assert again.result.cached_tokens > 0 and stranger.result.cached_tokens == 0
        assert not await path.keeper.end_session("s1", "client", "C")  # no such session for C
        assert path.keeper.sessions.named("B", first.result.session_key) is None

    _run(scenario)


@pytest.mark.parametrize("tool", [True, False])
def test_a_session_ended_while_its_call_runs_stays_ended_and_leaves_nothing(tool: bool) -> None:
    """Its call finishes and is recorded, but the session keeps no reservation or learned gap
    in memory, takes no reservation, and no later session record reopens it."""
    keys: list[str] = []

    async def scenario(path: CallPath, clock: LoopClock) -> None:
        handle = await path.gateway.open_call(_call(0, tool=tool))
        keys.append(handle.session_key)
        assert await path.keeper.end_session("s1", "client", "t")
        await handle.outcome()
        assert handle.session_key not in path.keeper.preferences and len(path.keeper.sessions) == 0
        again = await (await path.gateway.open_call(_call(1, tool=tool))).outcome()
        assert again.result.session_key != handle.session_key  # a new session

    sink, _ = _run(scenario)
    mine = [r for r in sink.records if getattr(r, "session_key", None) == keys[0]]
    assert [r.state for r in mine if isinstance(r, SessionRecord)] == ["ended"]
    assert [r.status for r in mine if isinstance(r, CallRecord)] == ["ok"]
    assert not [r for r in mine if isinstance(r, ReservationRecord)]


@pytest.mark.parametrize(("stored_calls", "ended"), [(1, True), (4, False)])
def test_an_idle_ingress_session_another_replica_served_is_forgotten_not_ended(
    stored_calls: int, ended: bool
) -> None:
    """With ingress affinity (proxy/cluster/handoff.py): past the idle timeout, a session the
    store shows with more calls than this replica made (another served it since) is only
    forgotten; one it agrees on ends as usual."""

    async def scenario(path: CallPath, clock: LoopClock) -> None:
        async def adopt(
            tenant: str, sid: str, claim: SessionRecord | None = None
        ) -> AdoptableSession | None:
            state = path.keeper.sessions.named(tenant, sid)
            if state is None:  # its first call: nothing open in the store, nothing claimed
                return None
            return AdoptableSession(state.key, MODEL, datetime.now(UTC), stored_calls, "n0")

        path.gateway.use_replicas(lambda key: True, adopt, lambda: 0)
        call = replace(_call(0), route_key="ingress|t|s1")
        await (await path.gateway.open_call(call)).outcome()
        await clock.sleep(35.0)
        assert len(path.keeper.sessions) == 0  # gone from this replica either way

    sink, _ = _run(scenario, idle_timeout_s=30.0)
    ends = [r for r in sink.records if isinstance(r, SessionRecord) and r.state == "ended"]
    assert [r.end_reason for r in ends] == (["idle"] if ended else [])
