"""A session's runtime entries are bounded while it lives and gone once it ends (issue 46,
item 1), over any sequence of calls that open conversations (threads, retired past the cap)
and ends: through the gateway and the embedded node, on the virtual-time loop; and the book's
idle sweep walks only the sessions that idled out (item 6).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterator
from datetime import UTC, datetime

from hypothesis import example, given, settings
from hypothesis import strategies as st

from talaria.core.calls import Call
from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock, run_virtual
from talaria.proxy.callpath.gateway import call_path
from talaria.proxy.contract.calls import PreparedCall
from talaria.proxy.contract.identity import Identity
from talaria.proxy.contract.metrics import ProxyMetrics
from talaria.proxy.runtimes.embedded import InProcessRuntime
from talaria.proxy.sessions.book import SessionBook
from talaria.proxy.sessions.conversation import Conversation
from talaria.proxy.sessions.resolve import resolve
from talaria.proxy.sessions.state import SessionState
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import TALARIA
from talaria.runtime.sim_node import NodeSetup, build_sim_node
from tests.support import ListSink

MODEL = "glm-4.5-fp8"
CAP = 3
"""Threads a session may hold (``max_threads_per_session``)."""
NOW = datetime(2026, 12, 4, tzinfo=UTC)

ACTIONS = st.lists(
    st.tuples(st.sampled_from(["open", "open", "again", "end"]), st.integers(0, 1)),
    min_size=1,
    max_size=30,
)
"""``open``: a call that opens a new conversation of session 0 or 1; ``again``: a call that
repeats the session's first conversation (a retry: the same thread); ``end``: its end."""


def _call(session: int, conversation: int, n: int) -> PreparedCall:
    return PreparedCall(
        request_id=f"r{n}",
        tenant_id="t",
        identity=Identity(f"agent-{session}", "talaria"),
        api="chat",
        content=Call(
            model=MODEL,
            messages=({"role": "user", "content": f"conversation {conversation} " * 20},),
        ),
        max_tokens=8,
    )


def _held(keys: set[str], session_key: str) -> int:
    """How many of the node's keys are the session's (its own, ``<key>/<n>`` its threads')."""
    return sum(1 for k in keys if k == session_key or k.startswith(session_key + "/"))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(ACTIONS)
@example([("open", 0)] * (CAP + 3) + [("end", 0), ("open", 0)])
def test_runtime_entries_stay_within_the_thread_cap_and_go_at_the_end(
    actions: list[tuple[str, int]],
) -> None:
    async def main() -> None:
        clock = LoopClock()
        setup = NodeSetup("h200x8", "default", (MODEL,))
        node = build_sim_node("n0", setup, load_catalog(), TALARIA, SchedulerConfig(), clock)
        runtime = InProcessRuntime(node, clock, status_ttl_s=0.0)
        await runtime.start()
        path = call_path([runtime], ListSink(), ProxyMetrics(), clock, max_threads_per_session=CAP)
        ended: list[str] = []
        try:
            for n, (action, session) in enumerate(actions):
                if action != "end":
                    conversation = n if action == "open" else -1
                    await (await path.gateway.open_call(_call(session, conversation, n))).outcome()
                else:
                    state = await path.keeper.end_session(f"agent-{session}", "client", "t")
                    if state is not None:
                        ended.append(state.key)
                for _ in range(5):
                    await asyncio.sleep(0)  # the tasks that end retired threads
                keys = node.session_keys()
                for state in path.keeper.sessions:
                    assert _held(keys, state.key) <= CAP + 1
                for key in ended:
                    assert _held(keys, key) == 0, (key, keys)
        finally:
            await path.gateway.close()
            await runtime.close()

    run_virtual(main())


class CountingBook(OrderedDict[str, SessionState]):
    """The book's sessions, counting the sessions a walk of them visits."""

    visited = 0

    def values(self) -> Iterator[SessionState]:  # type: ignore[override]
        for state in super().values():
            CountingBook.visited += 1
            yield state


def test_the_idle_sweep_visits_the_idle_sessions_not_every_live_one() -> None:
    """10,000 live sessions, 10 of them idle past the timeout: the sweep visits 11 (the 10,
    and the first recent one where it stops), not 10,000 (issue 46: 18 % of a call's cost)."""
    book = SessionBook(capacity=20_000, max_per_tenant=20_000)
    book._sessions = CountingBook()
    for i in range(10_000):
        prompt = Conversation.of([{"role": "user", "content": f"task {i}"}])
        found = resolve(book,
            tenant_id="t", identity=Identity(None, "implicit"), model=MODEL,
            conversation=prompt, now_s=float(i), now_at=NOW,
        )  # fmt: skip
        book.call_started(found.state, prompt, float(i), found.thread)
        book.call_ended(found.state, found.thread)
    CountingBook.visited = 0
    idle = book.idle(now_s=10_009.5, timeout_s=10_000.0)
    assert [s.last_activity_s for s in idle] == [float(i) for i in range(10)]
    assert CountingBook.visited == 11
