"""A node forgets what it keeps of a session at the session's end (issue 46, item 1), and its
status and slot policy do not walk every session it knows (item 6).

Before: an end that arrived while a call of the session ran left its KV (unpinned once the call
ended) and its fair-queue account (``ServiceAccounts.forget_session`` was never called) for good;
a session whose end never arrived stayed for good; the status rebuilt every session's KV entry
and walked every session on each refresh. On the virtual-time loop, seeded where random.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock, run_virtual
from talaria.core.status import SessionKvStatus
from talaria.core.types import CallRequest, CallResult, KvSource
from talaria.runtime.memory.resources import KvLocation, NodeMemory, SessionKv
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import TALARIA
from talaria.runtime.scheduling.node import NodeScheduler
from talaria.runtime.scheduling.sessions import NodeSessions
from talaria.runtime.sim_node import NodeSetup, build_sim_node

GLM = "glm-4.5-fp8"
CATALOG = load_catalog()


def _node(config: SchedulerConfig | None = None) -> NodeScheduler:
    setup = NodeSetup("h200x8", "default", (GLM,))
    node = build_sim_node("n0", setup, CATALOG, TALARIA, config or SchedulerConfig(), LoopClock())
    node.start()
    return node


def test_an_end_while_a_call_runs_forgets_the_session_when_the_call_ends() -> None:
    """Its entry, its KV and its fair-queue account go once the running call is over."""

    async def main() -> tuple[set[str], set[str], set[str]]:
        node = _node()
        await node.submit(CallRequest("r0", "s1", GLM, 2000, 50))
        events = node.stream(CallRequest("r1", "s1", GLM, 3000, 400, stream=True))
        await anext(events)  # its first token: the call runs
        node.end_session("s1")
        during = node.session_keys()
        async for _ in events:  # to its end
            pass
        await asyncio.sleep(0)  # the call's settle callback
        after = node.session_keys()
        await node.submit(CallRequest("r2", "s2", GLM, 500, 5))
        node.end_session("s2")
        other = node.session_keys()
        await node.stop()
        return during, after, other

    during, after, other = run_virtual(main())
    assert "s1" in during  # its call still holds its KV
    assert after == set() and other == set()


def test_a_session_whose_end_never_came_is_forgotten_after_idling_an_hour() -> None:
    """The backstop for lost ends: idle past ``forget_idle_s``, a session goes at the next
    arrival or status read, unless a reservation still holds it (a hinted day-long tool, on a
    node whose operator allows hints that long: ``max_hint_gap_s``)."""

    async def main() -> tuple[set[str], set[str]]:
        clock = LoopClock()
        node = _node(SchedulerConfig(forget_idle_s=3600.0, max_hint_gap_s=86400.0))
        await node.submit(CallRequest("r0", "lost", GLM, 800, 10))
        await node.submit(CallRequest("r1", "held", GLM, 800, 10, expected_tool_gap_s=5000.0))
        await clock.sleep(1800.0)
        node.status()
        before = node.session_keys()
        await clock.sleep(1900.0)
        node.status()
        after = node.session_keys()
        await node.stop()
        return before, after

    before, after = run_virtual(main())
    assert before == {"lost", "held"}
    assert after == {"held"}


def test_a_status_refresh_builds_only_the_kv_entries_that_changed() -> None:
    """With 300 sessions' KV on the node, one more call rebuilds a handful of entries, and a
    refresh with no change none; the map equals one built from every entry."""

    async def main() -> tuple[int, int, int, bool]:
        node = _node()
        await asyncio.gather(
            *(node.submit(CallRequest(f"r{i}", f"s{i}", GLM, 600, 8)) for i in range(300))
        )
        reader = node._status
        node.status()
        start = reader.built
        node.status()
        unchanged = reader.built - start
        await node.submit(CallRequest("again", "s7", GLM, 700, 8))
        status = node.status()
        one_call = reader.built - start
        engine = node.engines[GLM]
        whole = {
            e.session_key: SessionKvStatus(
                e.location.value,
                e.tokens,
                e.model,
                0.0 if e.location is KvLocation.HBM else engine.kv_restore_s(e.tokens),
                engine.recompute_s(e.tokens),
            )
            for e in node.memory.kv.values()
        }
        await node.stop()
        return start, unchanged, one_call, status.sessions == whole

    start, unchanged, one_call, same = run_virtual(main())
    assert start >= 300
    assert unchanged == 0 and 1 <= one_call <= 3
    assert same


# -- the sessions' counters against a walk of them all ----------------------------------------
@dataclass
class Walked:
    """What the counters stand for, kept the plain way: per session its model, pending calls
    and last finish."""

    sessions: dict[str, list[object]] = field(default_factory=dict)

    def live(self, now_s: float, window_s: float) -> dict[str, int]:
        out: dict[str, int] = {}
        for model, pending, finished in self.sessions.values():
            gap = not pending and finished is not None and finished >= now_s - window_s  # type: ignore[operator]
            if pending or gap:
                out[str(model)] = out.get(str(model), 0) + 1
        return out


OPS = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "finish", "settle", "forget", "tick"]),
        st.integers(0, 5),
        st.integers(0, 1),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(OPS)
def test_live_counts_and_the_gap_index_match_a_walk(ops: list[tuple[str, int, int]]) -> None:
    """For any arrivals, finishes, settles and ends, the live sessions per model read from
    counters equal the walk the status used to do, and ``in_gap`` lists the same sessions."""
    sessions = NodeSessions()
    walked = Walked()
    now = 0.0
    window = 30.0
    for op, i, m in ops:
        key, model = f"s{i}", f"m{m}"
        now += 7.0 if op == "tick" else 1.0
        held = sessions.get(key)
        if op == "arrive":
            sessions.arrived(CallRequest(f"r{now}", key, model, 10, 1), now)
            row = walked.sessions.setdefault(key, [model, 0, None])
            row[1] = int(row[1]) + 1  # type: ignore[call-overload]
        elif op == "finish" and held is not None and held.pending:
            result = CallResult(
                "r", key, held.model, "n0", 10, 0, 1, arrival_s=now, admitted_s=now,
                first_token_s=now, finished_s=now, kv_source=KvSource.NEW, restored_bytes=0.0,
                recomputed_tokens=0, sp_admitted=False,
            )  # fmt: skip
            sessions.finished(result)
            walked.sessions[key][2] = now
        elif op == "settle" and held is not None and held.pending:
            sessions.settled(key)
            walked.sessions[key][1] = int(walked.sessions[key][1]) - 1  # type: ignore[call-overload]
        elif op == "forget":
            sessions.forget(key)
            walked.sessions.pop(key, None)
        assert sessions.live_counts(now, window) == walked.live(now, window)
        in_gap = {id(s) for s in sessions.in_gap(now, window)}
        listed = {k for k, s in sessions.sessions.items() if id(s) in in_gap}
        assert len(listed) == len(in_gap)
        assert listed == {
            k
            for k, (_, pending, finished) in walked.sessions.items()
            if not pending and finished is not None and finished >= now - window  # type: ignore[operator]
        }


# -- the eviction order against a sort of every entry -------------------------------------------
MEMORY_OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "move", "drop", "pin", "unpin", "use", "take"]),
        st.integers(0, 7),
        st.integers(0, 2),
    ),
    max_size=80,
)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(MEMORY_OPS)
def test_take_evictable_is_the_head_of_the_full_eviction_order(
    ops: list[tuple[str, int, int]],
) -> None:
    """For any puts, moves, drops, pins and uses (the engines and holds change ``pins`` and
    ``last_used_s`` in place), ``take_evictable`` returns the first entries of
    ``evictable``'s sorted order whose bytes reach the amount asked, or all of them."""
    memory = NodeMemory(1e12, 1e12)
    now = 0.0
    for op, i, k in ops:
        key = f"s{i}"
        now += 1.0
        entry = memory.kv.get(key)
        if op == "put":
            where = KvLocation.HBM if k else KvLocation.HOST
            memory.put(SessionKv(key, GLM, 10, 1.0 + i, where, now, rank=k))
        elif entry is not None and op == "move":
            other = KvLocation.HOST if entry.location is KvLocation.HBM else KvLocation.HBM
            memory.move(key, other)
        elif entry is not None and op == "drop":
            memory.drop(key)
        elif entry is not None and op == "pin":
            entry.pins += 1
        elif entry is not None and op == "unpin" and entry.pins:
            entry.pins -= 1
        elif entry is not None and op == "use":
            entry.last_used_s = now
        for where in KvLocation:
            order = memory.evictable(where)
            enough = float(k * 4 + i)
            taken = memory.take_evictable(where, enough, keep=("s0",))
            whole = [e for e in order if e.session_key != "s0"]
            prefix: list[SessionKv] = []
            for e in whole:
                if sum(p.nbytes for p in prefix) >= enough:
                    break
                prefix.append(e)
            assert taken == prefix
