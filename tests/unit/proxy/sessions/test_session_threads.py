"""A session's threads are bounded (issue 36, finding 4): 2,000 calls of one named session,
each with a new first message, opened 2,000 threads and 2,000 runtime session entries, of
which only 64 stayed indexed. Now a session holds at most ``max_threads`` live threads: the
least recently used idle one is retired (out of the index and the session, its reservation
released, its runtime entry ended), and with every thread busy the call is refused; a
tenant's threads count against its cap (tests/unit/proxy/sessions/test_session_cap.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from talaria.core.calls import Call, ToolChoice, ToolSpec
from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock, run_virtual
from talaria.proxy.callpath.gateway import call_path
from talaria.proxy.contract.calls import PreparedCall
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.contract.identity import Identity
from talaria.proxy.contract.metrics import ProxyMetrics
from talaria.proxy.contract.records import ReservationRecord
from talaria.proxy.runtimes.embedded import InProcessRuntime
from talaria.proxy.sessions.book import SessionBook
from talaria.proxy.sessions.conversation import Conversation, fingerprint
from talaria.proxy.sessions.resolve import resolve
from talaria.proxy.sessions.state import SessionState, Thread
from talaria.proxy.sessions.tenancy import ThreadLimit
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import TALARIA
from talaria.runtime.sim_node import NodeSetup, build_sim_node
from tests.support import ListSink

NOW = datetime(2026, 12, 4, tzinfo=UTC)
NAMED = Identity("run-1", "talaria")
MODEL = "glm-4.5-fp8"


def _start(book: SessionBook, first: str, now_s: float) -> tuple[SessionState, int]:
    """A call of the named session whose conversation starts with ``first``, sent."""
    prompt = Conversation.of([{"role": "user", "content": first}])
    found = resolve(
        book, tenant_id="t", identity=NAMED, model="m", conversation=prompt, now_s=now_s, now_at=NOW
    )
    book.call_started(found.state, prompt, now_s, found.thread)
    return found.state, found.thread


def _answer(book: SessionBook, state: SessionState, thread: int, first: str) -> None:
    prompt = Conversation.of([{"role": "user", "content": first}])
    reply = fingerprint({"role": "assistant", "content": "ok"})
    book.call_finished(state, prompt, reply, 0.0, thread)
    book.call_ended(state, thread)


def test_two_thousand_new_conversations_keep_at_most_the_bound() -> None:
    retired: list[int] = []
    book = SessionBook(max_threads=64, on_retire=lambda s, t: retired.append(t.number))
    for i in range(2000):
        state, thread = _start(book, f"conversation {i}", float(i))
        _answer(book, state, thread, f"conversation {i}")
    assert len(state.threads) == 64 and book.threads("t") == 64
    assert sorted(state.threads) == list(range(2000 - 64, 2000))  # the newest live
    assert retired == list(range(2000 - 64))  # each retired once, least recently used first
    assert len(book._index) <= 2 * 64  # two entries per live thread


def test_a_thread_in_use_is_never_retired_and_all_busy_is_refused() -> None:
    retired: list[Thread] = []
    book = SessionBook(max_threads=3, on_retire=lambda s, t: retired.append(t))
    state, oldest = _start(book, "a", 0.0)  # stays in flight
    _answer(book, *_start(book, "b", 1.0), "b")
    _start(book, "c", 2.0)  # in flight
    _start(book, "d", 3.0)  # retires b, the only idle one
    assert [t.number for t in retired] == [1] and sorted(state.threads) == [0, 2, 3]
    with pytest.raises(ThreadLimit):
        _start(book, "e", 4.0)
    book.call_ended(state, oldest)
    _start(book, "e", 5.0)  # a is idle now: it goes
    assert [t.number for t in retired] == [1, 0] and book.threads("t") == 3


def _call(first: str, n: int) -> PreparedCall:
    bash = ToolSpec("bash", "run a command", {"type": "object", "properties": {}})
    return PreparedCall(
        request_id=f"r-{first}-{n}",
        tenant_id="t",
        identity=NAMED,
        api="chat",
        content=Call(
            model=MODEL,
            messages=({"role": "user", "content": f"{first} " * 40},),
            tools=(bash,),
            tool_choice=ToolChoice("required"),
        ),
        max_tokens=16,
    )


def test_through_the_gateway_retired_threads_leave_the_runtime_and_release_reservations() -> None:
    """Twenty conversations under one id with a bound of four: the runtime holds the live
    threads' entries only, each retired thread's reservation is released ``retired``, and
    with four calls in flight a fifth conversation gets 429 ``too_many_threads``."""
    sink = ListSink()

    async def main() -> None:
        clock = LoopClock()
        node = build_sim_node(
            "n0", NodeSetup("h200x8", "default", (MODEL,)), load_catalog(), TALARIA,
            SchedulerConfig(), clock,
        )  # fmt: skip
        runtime = InProcessRuntime(node, clock, status_ttl_s=0.0)
        await runtime.start()
        path = call_path([runtime], sink, ProxyMetrics(), clock, max_threads_per_session=4)
        try:
            for i in range(20):
                await (await path.gateway.open_call(_call(f"task {i}", i))).outcome()
            for _ in range(5):
                await asyncio.sleep(0)  # the tasks that end retired threads on the runtime
            state = path.keeper.sessions.named("t", "run-1")
            assert state is not None and sorted(state.threads) == [16, 17, 18, 19]
            on_runtime = [k for k in (await runtime.status()).sessions if k.startswith(state.key)]
            assert sorted(on_runtime) == sorted(state.runtime_key(n) for n in state.threads)
            busy = [await path.gateway.open_call(_call(f"busy {i}", 100 + i)) for i in range(4)]
            with pytest.raises(ApiError) as refused:
                await path.gateway.open_call(_call("one too many", 200))
            assert (refused.value.status, refused.value.code) == (429, "too_many_threads")
            for handle in busy:
                await handle.outcome()
        finally:
            await path.gateway.close()
            await runtime.close()

    run_virtual(main())
    reservations: dict[str, list[str | None]] = {}
    for r in sink.records:
        if isinstance(r, ReservationRecord):
            reservations.setdefault(r.reservation_id, []).append(r.release_reason)
    retired = [reasons for reasons in reservations.values() if "retired" in reasons]
    assert len(retired) >= 16 - 4  # the reservations the retired threads still held
