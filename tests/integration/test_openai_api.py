"""The real ``openai`` client against the proxy over real HTTP (uvicorn on a loopback port),
with the embedded simulated runtime running 500× faster than real time and a real SQLite file."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from talaria.proxy.contract.settings import ProxySettings
from tests.integration.server import RunningProxy, running_proxy
from tests.support import pg_url, reset_postgres

ADMIN = "admin-secret-token"
MODEL = "glm-4.5-fp8"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


def _settings(tmp: Path, **extra: object) -> ProxySettings:
    return ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp}/proxy.db",
        admin_token=ADMIN,
        time_scale=500.0,
        max_request_bytes=256 * 1024,
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with running_proxy(_settings(tmp_path_factory.mktemp("proxy"))) as running:
        yield running


@pytest.fixture
def client(proxy: RunningProxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.v1, api_key="anything", max_retries=0)


def _sid() -> str:
    return f"s-{uuid.uuid4().hex[:12]}"


def _admin(proxy: RunningProxy, path: str) -> httpx.Response:
    return httpx.get(proxy.base_url + path, headers={"Authorization": f"Bearer {ADMIN}"})


def test_chat_completion_with_session_header(proxy: RunningProxy, client: openai.OpenAI) -> None:
    sid = _sid()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "fix the failing test " * 50}],
        extra_headers={"X-Talaria-Session-Id": sid},
    )
    assert raw.headers["x-request-id"]
    assert raw.headers["x-talaria-session-id"] == sid
    reply = raw.parse()
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.content.startswith("[simulated]")
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    assert reply.usage.prompt_tokens_details.cached_tokens == 0


def test_continuation_reports_cached_prompt_tokens(client: openai.OpenAI) -> None:
    sid = _sid()
    messages = [{"role": "user", "content": "explain the repository layout " * 80}]
    first = client.chat.completions.create(
        model=MODEL, messages=messages, extra_headers={"X-Talaria-Session-Id": sid}
    )
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "now run the tests"},
    ]
    second = client.chat.completions.create(
        model=MODEL, messages=messages, extra_headers={"X-Talaria-Session-Id": sid}
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    shared = first.usage.prompt_tokens + first.usage.completion_tokens
    assert 0 < cached <= shared
    assert cached >= shared - 16  # whole 16-token blocks of the shared prefix
    # a rewritten history shares nothing
    rewritten = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "something else entirely " * 40}],
        extra_headers={"X-Talaria-Session-Id": sid},
    )
    assert rewritten.usage.prompt_tokens_details.cached_tokens == 0


def test_streaming_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "stream please"}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=40,
        extra_headers={"X-Talaria-Session-Id": _sid()},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    usage = chunks[-1].usage
    assert text.startswith("[simulated]")
    assert len(text.split()) == usage.completion_tokens <= 40
    assert finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and usage.prompt_tokens > 0
    assert len(chunks) >= 4  # role, tokens in several deltas, finish, usage


def test_tool_calls_pass_through_streaming_and_not(client: openai.OpenAI) -> None:
    sid = _sid()
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "list the files"}],
        tools=TOOLS,
        extra_headers={"X-Talaria-Session-Id": sid},
    )
    call = reply.choices[0].message.tool_calls[0]
    assert reply.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "bash"
    assert json.loads(call.function.arguments) == {"command": "ls"}  # schema-valid, harmless
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "list the files"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "bash"}},
        stream=True,
        extra_headers={"X-Talaria-Session-Id": _sid()},
    )
    chunks = [c for c in stream if c.choices]
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert deltas[0].function.name == "bash" and deltas[0].id
    assert json.loads(arguments) == json.loads(call.function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    none = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "just talk"}],
        tools=TOOLS,
        tool_choice="none",
    )
    assert none.choices[0].message.tool_calls is None


def test_async_client_runs_sessions_concurrently(proxy: RunningProxy) -> None:
    async def main() -> list[int]:
        client = openai.AsyncOpenAI(base_url=proxy.v1, api_key="x", max_retries=0)

        async def one(i: int) -> int:
            reply = await client.chat.completions.create(
                model=["glm-4.5-fp8", "qwen3-235b-a22b-bf16"][i % 2],
                messages=[{"role": "user", "content": f"task {i} " * 30}],
                extra_headers={"X-Talaria-Session-Id": _sid()},
            )
            return reply.usage.completion_tokens

        try:
            return await asyncio.gather(*(one(i) for i in range(8)))
        finally:
            await client.close()

    assert all(tokens > 0 for tokens in asyncio.run(main()))


def test_completions_endpoint(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=12)
    assert reply.object == "text_completion"
    assert reply.choices[0].text.startswith("[simulated]")
    assert reply.usage.completion_tokens <= 12
    chunks = list(client.completions.create(model=MODEL, prompt="x", max_tokens=10, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices).startswith("[simulated]")


def test_models_list_shows_residency(client: openai.OpenAI, proxy: RunningProxy) -> None:
    ids = [m.id for m in client.models.list()]
    assert ids == sorted(["glm-4.5-fp8", "qwen3-235b-a22b-bf16", "qwen3-coder-480b-a35b-fp8"])
    data = httpx.get(proxy.v1 + "/models").json()["data"]
    states = {i["state"] for m in data for i in m["instances"]}
    assert states <= {"active", "staged", "host"} and data[0]["context_window"] > 0


@pytest.mark.parametrize(
    ("headers", "body_extra"),
    [
        ({"x-session-id": "SID"}, {}),
        ({"x-litellm-session-id": "SID"}, {}),
        ({}, {"litellm_session_id": "SID"}),
        ({}, {"prompt_cache_key": "SID"}),
    ],
)
def test_alternative_session_identities(
    client: openai.OpenAI, proxy: RunningProxy, headers: dict[str, str], body_extra: dict[str, str]
) -> None:
    sid = _sid()
    headers = {k: sid for k in headers}
    body = {k: sid for k in body_extra}
    for _ in range(2):
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers=headers,
            extra_body=body,
        )
    detail = _admin(proxy, f"/admin/sessions/{sid}").json()
    assert [c["call_index"] for c in detail["calls"]] == [0, 1]


def _converse(client: openai.OpenAI, task: str, steps: int) -> list[httpx.Headers]:
    """A conversation with no session header: each call sends the history plus the reply."""
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are a coding agent. " * 40},
        {"role": "user", "content": task},
    ]
    headers = []
    for step in range(steps):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, tools=TOOLS
        )
        headers.append(raw.headers)
        message = raw.parse().choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        messages.append(
            {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": f"out {step}"}
        )
    return headers


def test_a_plain_client_gets_one_session_per_conversation(
    client: openai.OpenAI, proxy: RunningProxy
) -> None:
    first = _converse(client, "fix the failing test", 3)
    second = _converse(client, "add a feature", 3)
    ids = {h["x-talaria-session-id"] for h in first}, {h["x-talaria-session-id"] for h in second}
    assert len(ids[0]) == 1 and len(ids[1]) == 1 and ids[0] != ids[1]
    for headers in (first, second):
        detail = _admin(proxy, f"/admin/sessions/{headers[0]['x-talaria-session-id']}").json()
        assert detail["session"]["identity_source"] == "implicit"
        assert detail["session"]["state"] == "in_tool"  # its reply was a tool call
        assert [c["call_index"] for c in detail["calls"]] == [0, 1, 2]
        assert [c["cached_tokens"] > 0 for c in detail["calls"]] == [False, True, True]
        assert all(c["api"] == "chat" for c in detail["calls"])


def test_a_rewritten_history_starts_a_new_session(client: openai.OpenAI) -> None:
    task = [{"role": "user", "content": "refactor the parser " * 20}]
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=task)
    reply = raw.parse().choices[0].message.model_dump(exclude_none=True)
    follow = [*task, reply, {"role": "user", "content": "go on"}]
    same = client.chat.completions.with_raw_response.create(model=MODEL, messages=follow)
    rewritten = [{"role": "user", "content": "refactor the lexer " * 20}, reply, follow[-1]]
    other = client.chat.completions.with_raw_response.create(model=MODEL, messages=rewritten)
    sid = raw.headers["x-talaria-session-id"]
    assert same.headers["x-talaria-session-id"] == sid
    assert other.headers["x-talaria-session-id"] != sid
    assert other.parse().usage.prompt_tokens_details.cached_tokens == 0


def test_a_text_completion_without_session_is_its_own_ended_session(
    client: openai.OpenAI, proxy: RunningProxy
) -> None:
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="one-off", max_tokens=8)
    sid = raw.headers["x-talaria-session-id"]
    detail = _admin(proxy, f"/admin/sessions/{sid}").json()
    assert detail["session"]["state"] == "ended" and len(detail["calls"]) == 1


def test_session_timeline_hints_reservations_and_end(
    client: openai.OpenAI, proxy: RunningProxy
) -> None:
    sid = _sid()
    headers = {"X-Talaria-Session-Id": sid}
    messages: list[dict[str, object]] = [{"role": "user", "content": "fix the bug " * 40}]
    for step in range(3):
        reply = client.chat.completions.create(
            model=MODEL, messages=messages, tools=TOOLS, extra_headers=headers
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        messages.append(
            {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": f"out {step}"}
        )
        hinted = httpx.post(
            f"{proxy.v1}/sessions/{sid}/hints", json={"expected_s": 2.5, "tool": "bash"}
        )
        assert hinted.status_code == 200
    ended = httpx.post(f"{proxy.v1}/sessions/{sid}/end")
    assert ended.json() == {"session_id": sid, "ended": True}
    detail = _admin(proxy, f"/admin/sessions/{sid}").json()
    assert detail["session"]["state"] == "ended"
    assert detail["session"]["end_reason"] == "client"
    assert [c["call_index"] for c in detail["calls"]] == [0, 1, 2]
    assert all(c["routing_reason"] for c in detail["calls"])
    assert detail["calls"][1]["cached_tokens"] > 0
    assert all(c["queue_s"] is not None and c["decode_s"] > 0 for c in detail["calls"])
    assert len(detail["tool_gaps"]) == 2 and all(g["gap_s"] >= 0 for g in detail["tool_gaps"])
    assert [h["tool"] for h in detail["hints"] if h["kind"] == "tool_gap"] == ["bash"] * 3
    reasons = [r["release_reason"] for r in detail["reservations"]]
    assert reasons and set(reasons) <= {"returned", "replaced", "ended", "expired"}
    # at 500× a 2.5 s hint expires within milliseconds: each reservation is released somehow
    assert all(r["released_at"] for r in detail["reservations"])
    listed = _admin(proxy, f"/admin/sessions?model={MODEL}&state=ended&limit=200").json()
    assert sid in [s["session_id"] for s in listed["data"]]
    again = httpx.post(f"{proxy.v1}/sessions/{sid}/hints", json={"expected_s": 1})
    assert again.status_code == 404 and again.json()["error"]["code"] == "session_not_found"


def test_admin_end_and_instances(client: openai.OpenAI, proxy: RunningProxy) -> None:
    sid = _sid()
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "x"}],
        extra_headers={"x-session-id": sid},
    )
    auth = {"Authorization": f"Bearer {ADMIN}"}
    ended = httpx.post(f"{proxy.base_url}/admin/sessions/{sid}/end", headers=auth)
    assert ended.status_code == 200
    assert _admin(proxy, f"/admin/sessions/{sid}").json()["session"]["end_reason"] == "admin"
    instances = _admin(proxy, "/admin/instances").json()["data"]
    assert instances[0]["name"] == "node0" and instances[0]["kind"] == "in-process"
    assert instances[0]["gap_models"]["mean"]["quantile"] == 0.95  # how well it predicts gaps
    assert set(instances[0]["residency"]) == {
        "glm-4.5-fp8",
        "qwen3-235b-a22b-bf16",
        "qwen3-coder-480b-a35b-fp8",
    }
    denied = httpx.get(f"{proxy.base_url}/admin/sessions", headers={"Authorization": "Bearer no"})
    assert denied.status_code == 401 and "error" in denied.json()


def test_session_paging(client: openai.OpenAI, proxy: RunningProxy) -> None:
    tenant_sessions = set()
    for _ in range(5):
        sid = _sid()
        tenant_sessions.add(sid)
        client.chat.completions.create(
            model="qwen3-coder-480b-a35b-fp8",
            messages=[{"role": "user", "content": "p"}],
            extra_headers={"x-session-id": sid},
        )
    seen: list[str] = []
    cursor = None
    while True:
        query = "?model=qwen3-coder-480b-a35b-fp8&limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = _admin(proxy, "/admin/sessions" + query).json()
        seen += [s["session_id"] for s in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert tenant_sessions <= set(seen) and len(seen) == len(set(seen))
    bad = _admin(proxy, "/admin/sessions?cursor=garbage")
    assert bad.status_code == 400


def test_metrics_exposed(client: openai.OpenAI, proxy: RunningProxy) -> None:
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "m"}])
    text = httpx.get(proxy.base_url + "/metrics").text
    for name in (
        "talaria_call_latency_seconds_bucket",
        "talaria_ttft_seconds_count",
        "talaria_session_completion_seconds_count",
        "talaria_routing_decisions_total",
        "talaria_kv_hit_ratio",
    ):
        assert name in text


# -- errors -----------------------------------------------------------------------------------
def _error(response: httpx.Response) -> dict[str, object]:
    body = response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert response.headers["x-request-id"]
    return body["error"]


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    assert info.value.body["code"] == "model_not_found"


def test_invalid_bodies(proxy: RunningProxy, client: openai.OpenAI) -> None:
    url = proxy.v1 + "/chat/completions"
    not_json = httpx.post(url, content=b"{nope", headers={"content-type": "application/json"})
    assert not_json.status_code == 400 and "not valid JSON" in _error(not_json)["message"]
    missing = httpx.post(url, json={"model": MODEL})
    assert missing.status_code == 422 and _error(missing)["param"] == "messages"
    bad_role = httpx.post(url, json={"model": MODEL, "messages": [{"role": "robot"}]})
    assert bad_role.status_code == 422 and _error(bad_role)["param"] == "messages.0.role"
    too_big = httpx.post(
        url, json={"model": MODEL, "messages": [{"role": "user", "content": "x" * 300_000}]}
    )
    assert too_big.status_code == 413 and _error(too_big)["code"] == "request_too_large"
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model=MODEL, messages=[])
    gap = httpx.post(
        url,
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
        headers={"X-Talaria-Tool-Gap-Ms": "soon"},
    )
    assert gap.status_code == 400
    long = httpx.post(
        url,
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**7},
    )
    assert long.status_code == 400 and _error(long)["code"] == "context_length_exceeded"
    route = httpx.get(proxy.base_url + "/v1/nothing-here")
    assert route.status_code == 404 and _error(route)


def test_api_keys_are_enforced_when_configured(tmp_path: Path) -> None:
    with running_proxy(_settings(tmp_path, api_keys=["key-1"])) as proxy:
        good = openai.OpenAI(base_url=proxy.v1, api_key="key-1", max_retries=0)
        assert good.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}]
        ).choices
        bad = openai.OpenAI(base_url=proxy.v1, api_key="key-2", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as info:
            bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        assert info.value.status_code == 401
        assert info.value.body["type"] == "authentication_error"
        assert httpx.get(proxy.v1 + "/models").status_code == 401


def test_admin_api_is_off_without_a_token(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    settings.admin_token = None
    with running_proxy(settings) as proxy:
        response = httpx.get(proxy.base_url + "/admin/sessions")
        assert response.status_code == 404 and "TALARIA_ADMIN_TOKEN" in _error(response)["message"]


def test_too_many_requests_in_flight_is_429(tmp_path: Path) -> None:
    settings = _settings(tmp_path, max_inflight_per_tenant=1)
    settings.time_scale = 1.0  # real time: the streamed call stays in flight for a while
    with running_proxy(settings) as proxy:

        async def main() -> tuple[int, int, str]:
            async with httpx.AsyncClient(base_url=proxy.v1, timeout=120) as http:
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "x"}],
                    "stream": True,
                }
                async with http.stream("POST", "/chat/completions", json=body) as first:
                    lines = first.aiter_lines()
                    assert (await anext(lines)).startswith("data: ")  # in flight now
                    second = await http.post("/chat/completions", json={**body, "stream": False})
                    rest = [line async for line in lines]
                    assert "data: [DONE]" in rest  # the first call still completes
                    return first.status_code, second.status_code, second.headers["retry-after"]

        first, second, retry_after = asyncio.run(main())
        assert (first, second) == (200, 429) and int(retry_after) >= 1


def test_proxy_on_postgresql() -> None:
    """The whole proxy on a real PostgreSQL server (scripts/test.sh starts one)."""
    url = pg_url()
    asyncio.run(reset_postgres(url))  # no keys or sessions of other tests
    settings = ProxySettings(database_url=url, admin_token=ADMIN, time_scale=500.0)
    with running_proxy(settings) as proxy:
        client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
        sid = _sid()
        for _ in range(2):
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "on postgres"}],
                extra_headers={"X-Talaria-Session-Id": sid},
            )
        detail = _admin(proxy, f"/admin/sessions/{sid}").json()
        assert [c["call_index"] for c in detail["calls"]] == [0, 1]
        assert detail["session"]["calls"] == 2


@pytest.mark.parametrize("bad", ["line\r\nbreak", "emoji 🙂", "nul\x00", "rtl\u202e", "x" * 201])
def test_a_session_id_from_the_body_is_validated_like_a_header(
    proxy: RunningProxy, bad: str
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "prompt_cache_key": bad}
    reply = httpx.post(proxy.v1 + "/chat/completions", json=body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["code"] == "invalid_session" and error["param"] == "prompt_cache_key"
    assert "x-talaria-session-id" not in reply.headers
