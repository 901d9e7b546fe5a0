"""Session scopes without a server: ids, nesting, ContextVar isolation across tasks and
threads, the tool-gap estimate, reply endings, and a side channel that never raises."""

from __future__ import annotations

import asyncio
import contextvars
import subprocess
import sys
import threading
from collections.abc import Callable

import httpx
import pytest

from talaria.sdk import DEFAULT_GAP_S, Session, SideChannel, current_session, session
from talaria.sdk import sessions as sdk_sessions
from talaria.sdk.headers import (
    DEADLINE_S,
    PARENT_SESSION_ID,
    PRIORITY,
    SESSION_ID,
    TOOL_GAP_MS,
    endpoint_url,
    session_headers,
)
from talaria.sdk.replies import finish_of, offers_tools


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(sdk_sessions, "_now", fake)
    return fake


def test_import_is_thin() -> None:
    code = (
        "import sys, talaria.sdk, talaria.sdk.litellm\n"
        "heavy = ('fastapi', 'sqlalchemy', 'torch', 'vllm', 'litellm', 'starlette', 'uvicorn')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_ids_nesting_and_parents() -> None:
    assert current_session() is None
    with session() as outer:
        assert outer.id.startswith("sess-") and current_session() is outer
        assert outer.parent is None
        with session("inner-1") as inner:
            assert current_session() is inner
            assert inner.id == "inner-1" and inner.parent == outer.id
            with session(parent="explicit") as third:
                assert third.parent == "explicit"
            assert current_session() is inner
        assert current_session() is outer
    assert current_session() is None
    assert session().id != session().id


def test_headers() -> None:
    s = Session("abc", "par")
    assert s.headers() == {SESSION_ID: "abc", PARENT_SESSION_ID: "par"}
    assert s.headers(tools=True)[TOOL_GAP_MS] == str(round(DEFAULT_GAP_S * 1000))
    assert endpoint_url("http://h/v1/", "a/b c", "end") == "http://h/v1/sessions/a%2Fb%20c/end"


def test_priority_and_deadline_headers_and_their_nesting() -> None:
    s = Session("abc", priority="Batch", deadline_s=90)
    assert s.headers() == {SESSION_ID: "abc", PRIORITY: "batch", DEADLINE_S: "90.0"}
    assert PRIORITY not in Session("plain").headers()  # none: the API key's default
    with session("outer", priority="interactive", end_on_exit=False):
        with session("inner", end_on_exit=False) as inner:
            assert inner.headers()[PRIORITY] == "interactive"  # the enclosing session's
            assert DEADLINE_S not in inner.headers()
        with session("own", priority="standard", end_on_exit=False) as own:
            assert own.headers()[PRIORITY] == "standard"
    for bad in ({"priority": "urgent"}, {"deadline_s": 0}, {"deadline_s": -1.0}):
        with pytest.raises(ValueError):
            session(**bad)  # type: ignore[arg-type]
    for deadline in (float("nan"), float("inf"), 8 * 24 * 3600.0):
        with pytest.raises(ValueError, match="deadline_s"):
            session_headers("abc", deadline_s=deadline)


@pytest.mark.asyncio
async def test_task_inherits_and_concurrent_tasks_do_not_mix() -> None:
    async with session(end_on_exit=False) as s:

        async def child() -> Session | None:
            return current_session()

        assert await asyncio.create_task(child()) is s
    assert current_session() is None

    entered = {"a": asyncio.Event(), "b": asyncio.Event()}
    results: dict[str, tuple[str, str]] = {}

    async def worker(name: str, other: str) -> None:
        async with session(f"task-{name}", end_on_exit=False) as mine:
            entered[name].set()
            await entered[other].wait()  # both scopes are open now, interleaved
            current = current_session()
            assert current is not None
            results[name] = (mine.id, current.id)

    await asyncio.gather(worker("a", "b"), worker("b", "a"))
    assert results == {"a": ("task-a", "task-a"), "b": ("task-b", "task-b")}


def test_threads_do_not_mix_and_copy_context_shares() -> None:
    barrier = threading.Barrier(2)
    results: dict[str, str | None] = {}

    def worker(name: str) -> None:
        with session(f"thread-{name}", end_on_exit=False):
            barrier.wait()
            current = current_session()
            results[name] = current.id if current else None
            barrier.wait()

    threads = [threading.Thread(target=worker, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"a": "thread-a", "b": "thread-b"}

    def probe(out: list[Session | None]) -> Callable[[], None]:
        return lambda: out.append(current_session())

    with session(end_on_exit=False) as s:
        plain: list[Session | None] = []
        shared: list[Session | None] = []
        t1 = threading.Thread(target=probe(plain))
        ctx = contextvars.copy_context()
        t2 = threading.Thread(target=lambda: ctx.run(probe(shared)))
        for t in (t1, t2):
            t.start()
            t.join()
    assert plain == [None] and shared == [s]


def test_tool_gap_estimate(clock: FakeClock) -> None:
    s = Session("gaps", end_on_exit=False)
    url = "http://talaria.invalid/v1"
    assert s.expected_gap_s == DEFAULT_GAP_S and not s.in_tool_gap
    headers = s.on_request(url, {}, offers_tools=True, first_attempt=True)
    assert headers[TOOL_GAP_MS] == "3000"
    assert TOOL_GAP_MS not in s.on_request(url, {}, offers_tools=False, first_attempt=True)
    for gap in (1.0, 2.0):
        clock.now += 0.5
        s.on_reply(url, talaria=True, finished=True, tool_calls=True)
        assert s.in_tool_gap
        clock.now += gap
        s.on_request(url, {}, offers_tools=True, first_attempt=True)
        assert not s.in_tool_gap
    assert s.gaps_s == [1.0, 2.0] and s.expected_gap_s == 1.5
    assert s.on_request(url, {}, offers_tools=True, first_attempt=False)[TOOL_GAP_MS] == "1500"
    # a retry is not a new call, and a reply that stops opens no gap
    assert s.calls == 4 and s.tool_calls == 2
    s.on_reply(url, talaria=True, finished=True, tool_calls=False)
    clock.now += 9.0
    s.on_request(url, {}, offers_tools=False, first_attempt=True)
    assert s.gaps_s == [1.0, 2.0]
    assert s.sct_s == pytest.approx(clock.now - 100.0 - 9.0)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"object": "chat.completion", "choices": [{"finish_reason": "tool_calls"}]}, True),
        ({"object": "chat.completion", "choices": [{"finish_reason": "stop"}]}, False),
        ({"object": "chat.completion.chunk", "choices": [{"finish_reason": None}]}, None),
        ({"object": "chat.completion.chunk", "choices": []}, None),
        ({"object": "text_completion", "choices": [{"finish_reason": "length"}]}, False),
        ({"object": "response", "status": "completed", "output": [{"type": "message"}]}, False),
        (
            {"object": "response", "status": "completed", "output": [{"type": "function_call"}]},
            True,
        ),
        ({"object": "response", "status": "in_progress", "output": []}, None),
        (
            {
                "type": "response.completed",
                "response": {"object": "response", "output": [{"type": "function_call"}]},
            },
            True,
        ),
        ({"type": "response.output_text.delta", "delta": "x"}, None),
        (
            {
                "event": "x",
                "data": {"object": "chat.completion", "choices": [{"finish_reason": "stop"}]},
            },
            False,
        ),
        ({"object": "list", "data": []}, None),
        ("not a mapping", None),
    ],
)
def test_finish_of(data: object, expected: bool | None) -> None:
    assert finish_of(data) is expected


def test_offers_tools() -> None:
    assert offers_tools({"tools": [{}]})
    assert not offers_tools({"tools": [{}], "tool_choice": "none"})
    assert not offers_tools({"tools": []}) and not offers_tools(None)


def test_side_channel_failures_are_swallowed(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(f"{request.method} {request.url.path}")
        if request.url.path.endswith("/hints"):
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(503)

    channel = SideChannel(timeout_s=1.0, transport=httpx.MockTransport(handler))
    s = Session("swallow", channel=channel)
    s.on_request(
        "http://t.invalid/v1", {"Authorization": "Bearer k"}, offers_tools=False, first_attempt=True
    )
    with caplog.at_level("WARNING", logger="talaria.sdk"):
        with s:
            s.tool_gap(expected_s=1.0, tool="pytest")
        s.end()  # a second end sends nothing
    assert calls == ["POST /v1/sessions/swallow/hints", "POST /v1/sessions/swallow/end"]
    assert s.ended and s.hints == 1
    assert any("failed" in r.message for r in caplog.records)
    assert any("503" in r.message for r in caplog.records)
    channel.close()


def test_no_call_no_request_and_known_other_servers_skipped() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.host)
        return httpx.Response(200, json={})

    channel = SideChannel(transport=httpx.MockTransport(handler))
    with session(channel=channel) as s:
        s.tool_gap(1.0)  # no call yet: nowhere to send it
        for host, talaria in (("tal.invalid", True), ("other.invalid", False)):
            url = f"http://{host}/v1"
            s.on_request(url, {}, offers_tools=False, first_attempt=True)
            s.on_reply(url, talaria=talaria, finished=True, tool_calls=False)
        s.on_request("http://unknown.invalid/v1", {}, offers_tools=False, first_attempt=True)
        s.tool_gap(1.0, "make")
        assert s.flush(timeout=5)
    assert sorted(calls) == sorted(["tal.invalid", "unknown.invalid"] * 2)
    channel.close()


def test_end_on_exit_false_keeps_the_session() -> None:
    calls: list[str] = []
    channel = SideChannel(
        transport=httpx.MockTransport(lambda r: calls.append(r.url.path) or httpx.Response(200))
    )
    with session("kept", end_on_exit=False, channel=channel) as s:
        s.on_request("http://t.invalid/v1", {}, offers_tools=False, first_attempt=True)
    assert not s.ended and calls == []


@pytest.mark.asyncio
async def test_async_end_waits_for_hints_then_ends() -> None:
    order: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        order.append(request.url.path.rsplit("/", 1)[-1])
        return httpx.Response(200, json={})

    channel = SideChannel(transport=httpx.MockTransport(handler))
    async with session("async-end", channel=channel) as s:
        s.on_request("http://t.invalid/v1", {}, offers_tools=False, first_attempt=True)
        s.tool_gap(2.0, "a")
        s.tool_gap(2.0, "b")
    assert order[-1] == "end" and sorted(order[:-1]) == ["hints", "hints"]
    channel.close()
