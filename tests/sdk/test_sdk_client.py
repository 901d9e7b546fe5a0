"""``talaria.sdk.OpenAI`` / ``AsyncOpenAI`` against a real proxy: the session headers on every
call (plain, streamed, raw, copied clients, retries), tool gaps, hints and the end, as the
proxy's admin API records them."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai
import pytest

from talaria.proxy.contract.settings import ProxySettings
from talaria.sdk import AsyncOpenAI, OpenAI, session
from talaria.sdk.headers import DEADLINE_S, PRIORITY, SESSION_ID
from tests.integration.server import RunningProxy, running_proxy
from tests.sdk.support import ADMIN, MODEL, TOOLS, Admin

USER = [{"role": "user", "content": "fix the failing test " * 20}]


@pytest.fixture
def client(proxy: RunningProxy) -> OpenAI:
    return OpenAI(base_url=proxy.v1, api_key="anything", max_retries=0)


def _agent_step(client: OpenAI, messages: list[dict[str, Any]]) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "ok"})


def test_calls_in_a_scope_are_one_session_ended_on_exit(client: OpenAI, admin: Admin) -> None:
    messages: list[dict[str, Any]] = list(USER)
    with session() as s:
        for _ in range(3):
            _agent_step(client, messages)
            assert s.in_tool_gap
        client.chat.completions.create(model=MODEL, messages=messages)
        assert not s.in_tool_gap
    detail = admin(f"/admin/sessions/{s.id}")
    assert detail["session"]["state"] == "ended" and detail["session"]["end_reason"] == "client"
    assert [c["call_index"] for c in detail["calls"]] == [0, 1, 2, 3]
    assert detail["calls"][1]["cached_tokens"] > 0
    hinted = [c["tool_gap_hint_s"] for c in detail["calls"]]
    assert hinted[0] == 3.0 and all(h is not None for h in hinted[:3]) and hinted[3] is None
    assert len(detail["tool_gaps"]) == 3
    assert s.calls == 4 and s.tool_calls == 3 and len(s.gaps_s) == 3
    assert s.sct_s is not None and s.sct_s > 0
    assert [h["kind"] for h in detail["hints"]] == ["end"]


def test_a_sessions_priority_and_deadline_go_with_each_call(
    client: OpenAI, proxy: RunningProxy
) -> None:
    seen: list[dict[str, str]] = []

    def note(request: httpx2.Request) -> None:
        seen.append({k: request.headers[k] for k in (PRIORITY, DEADLINE_S) if k in request.headers})

    http = httpx2.Client(event_hooks={"request": [note]})
    noted = OpenAI(base_url=proxy.v1, api_key="anything", max_retries=0, http_client=http)
    with session(priority="interactive", deadline_s=30) as s:
        reply = noted.chat.completions.with_raw_response.create(model=MODEL, messages=USER)
        assert reply.headers["x-talaria-session-id"] == s.id  # the proxy took both
        with session() as sub:  # a sub-agent: the same class, no deadline of its own
            noted.responses.create(model=MODEL, input="go on")
    assert seen == [{PRIORITY: "interactive", DEADLINE_S: "30.0"}, {PRIORITY: "interactive"}]
    assert sub.parent == s.id
    with session(), pytest.raises(openai.BadRequestError, match=PRIORITY):
        client.chat.completions.create(
            model=MODEL, messages=USER, extra_headers={PRIORITY: "urgent"}
        )


def test_streaming_raw_and_streaming_response(client: OpenAI, admin: Admin) -> None:
    with session() as s:
        stream = client.chat.completions.create(
            model=MODEL, messages=USER, tools=TOOLS, stream=True
        )
        chunks = list(stream)
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        assert s.in_tool_gap and s.tool_calls == 1
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=USER)
        assert raw.headers["x-talaria-session-id"] == s.id
        assert raw.parse().choices[0].message.content.startswith("[simulated]")
        assert not s.in_tool_gap
        with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=USER, stream=True
        ) as response:
            assert response.headers["x-talaria-session-id"] == s.id
            text = "".join(c.choices[0].delta.content or "" for c in response.parse())
        assert text.startswith("[simulated]")
        completion = client.completions.create(model=MODEL, prompt="def f():")
        assert completion.choices[0].text
    detail = admin(f"/admin/sessions/{s.id}")
    assert [c["stream"] for c in detail["calls"]] == [True, False, True, False]
    assert detail["session"]["state"] == "ended"


def test_with_options_and_copy_keep_the_session(client: OpenAI, admin: Admin) -> None:
    faster = client.with_options(timeout=30)
    extra = client.copy(default_headers={"X-Extra": "1"})
    assert isinstance(faster, OpenAI) and isinstance(extra, OpenAI)
    with session() as s:
        for c in (client, faster, extra):
            c.chat.completions.create(model=MODEL, messages=USER)
    assert admin(f"/admin/sessions/{s.id}")["session"]["calls"] == 3
    # outside any scope the client is the official one: the proxy finds the session itself
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=USER)
    assert raw.headers["x-talaria-session-id"] != s.id
    assert (
        admin(f"/admin/sessions/{raw.headers['x-talaria-session-id']}")["session"][
            "identity_source"
        ]
        == "implicit"
    )


def test_explicit_header_wins_and_end_on_exit_false(client: OpenAI, admin: Admin) -> None:
    with session(end_on_exit=False) as s:
        client.chat.completions.create(model=MODEL, messages=USER)
        client.chat.completions.create(
            model=MODEL, messages=USER, extra_headers={SESSION_ID: f"{s.id}-other"}
        )
    assert s.calls == 1 and not s.ended
    assert admin(f"/admin/sessions/{s.id}")["session"]["state"] != "ended"
    assert admin(f"/admin/sessions/{s.id}-other")["session"]["calls"] == 1
    s.end()
    assert admin(f"/admin/sessions/{s.id}")["session"]["state"] == "ended"


def test_nested_sessions_record_the_parent(client: OpenAI, admin: Admin) -> None:
    with session() as outer:
        client.chat.completions.create(model=MODEL, messages=USER)
        with session() as sub:
            client.chat.completions.create(model=MODEL, messages=USER)
        client.chat.completions.create(model=MODEL, messages=USER)
    outer_key = admin(f"/admin/sessions/{outer.id}")["session"]["session_key"]
    assert admin(f"/admin/sessions/{sub.id}")["session"]["parent_session_key"] == outer_key
    assert admin(f"/admin/sessions/{outer.id}")["session"]["calls"] == 2


def test_explicit_hint_is_recorded(client: OpenAI, admin: Admin) -> None:
    with session() as s:
        _agent_step(client, list(USER))
        s.tool_gap(expected_s=12.5, tool="pytest")
        assert s.flush(timeout=10)
    detail = admin(f"/admin/sessions/{s.id}")
    hints = [(h["kind"], h["expected_s"], h["tool"]) for h in detail["hints"]]
    assert hints == [("tool_gap", 12.5, "pytest"), ("end", None, None)]
    assert detail["reservations"]


def test_threads_each_with_a_session(client: OpenAI, admin: Admin) -> None:
    barrier = threading.Barrier(3)
    ids: dict[int, str] = {}

    def agent(n: int) -> None:
        with session() as s:
            ids[n] = s.id
            for _ in range(2):
                barrier.wait()  # the three sessions' calls interleave
                client.chat.completions.create(model=MODEL, messages=USER)

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for sid in ids.values():
        assert admin(f"/admin/sessions/{sid}")["session"]["calls"] == 2


@pytest.mark.asyncio
async def test_async_client_concurrent_sessions(proxy: RunningProxy, admin: Admin) -> None:
    client = AsyncOpenAI(base_url=proxy.v1, api_key="anything", max_retries=0)
    go = asyncio.Event()

    async def agent(steps: int) -> str:
        async with session() as s:
            await go.wait()
            messages: list[dict[str, Any]] = list(USER)
            for _ in range(steps):
                reply = await client.chat.completions.create(
                    model=MODEL, messages=messages, tools=TOOLS
                )
                message = reply.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                for call in message.tool_calls or []:
                    messages.append({"role": "tool", "content": "ok", "tool_call_id": call.id})
            stream = await client.chat.completions.create(
                model=MODEL, messages=messages, stream=True
            )
            async for _ in stream:
                pass
            raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=USER)
            assert raw.headers["x-talaria-session-id"] == s.id
            # a task created inside the scope joins the session
            await asyncio.create_task(client.chat.completions.create(model=MODEL, messages=USER))
            return s.id

    tasks = [asyncio.create_task(agent(n % 3 + 1)) for n in range(8)]
    go.set()
    ids = await asyncio.gather(*tasks)
    await client.close()
    for n, sid in enumerate(ids):
        detail = admin(f"/admin/sessions/{sid}")
        # every call inside ``session(id=...)`` is the session's, even those that restart
        # from the task (another thread of it, not a child)
        assert detail["session"]["calls"] == n % 3 + 1 + 3 and detail["children"] == []
        assert detail["session"]["state"] == "ended"


def test_retries_carry_the_session_headers() -> None:
    attempts: list[httpx2.Headers] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        attempts.append(request.headers)
        if len(attempts) == 1:
            return httpx2.Response(500, headers={"retry-after-ms": "1"}, json={"error": {}})
        body = {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hi"},
                    "finish_reason": "stop",
                }
            ],
        }
        return httpx2.Response(200, json=body)

    http = httpx2.Client(transport=httpx2.MockTransport(handler))
    client = OpenAI(base_url="http://mock.invalid/v1", api_key="k", http_client=http, max_retries=2)
    with session(end_on_exit=False) as s:
        client.chat.completions.create(model=MODEL, messages=USER)
    assert [h["x-stainless-retry-count"] for h in attempts] == ["0", "1"]
    assert all(h[SESSION_ID] == s.id for h in attempts)
    assert s.calls == 1


def test_errors_pass_through_unchanged(client: OpenAI) -> None:
    with session(), pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=USER)


def test_hints_and_end_carry_the_api_key(tmp_path: Path) -> None:
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path}/keys.db",
        admin_token=ADMIN,
        time_scale=500.0,
        api_keys=["key-1"],
    )
    with running_proxy(settings) as keyed:
        client = OpenAI(base_url=keyed.v1, api_key="key-1", max_retries=0)
        with session() as s:
            _agent_step(client, list(USER))
            s.tool_gap(expected_s=4.0, tool="make")
        auth = {"Authorization": f"Bearer {ADMIN}"}
        detail = httpx.get(f"{keyed.base_url}/admin/sessions/{s.id}", headers=auth).json()
    assert detail["session"]["state"] == "ended" and detail["session"]["end_reason"] == "client"
    assert [h["tool"] for h in detail["hints"]] == ["make", None]
