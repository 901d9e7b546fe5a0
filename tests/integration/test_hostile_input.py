"""What a security review threw at the proxy, as regression tests through the real HTTP stack:
bad numbers, malformed bodies and header values get a 4xx and never break the session; two
tenants with the same session id never meet; durations are wall seconds.

Every case here was a 500, a hang, a dropped connection or a cross-tenant leak before."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.store.db import make_engine, make_sessionmaker
from talaria.proxy.store.repository import SqlStore
from tests.integration.server import RunningProxy, running_proxy
from tests.schemas import SCHEMAS

ADMIN = "admin-secret-token"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
MODEL = "glm-4.5-fp8"
SCALE = 200.0


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("hostile")
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp}/h.db",
        admin_token=ADMIN,
        models=[MODEL],
        time_scale=SCALE,
    )
    with running_proxy(settings) as running:
        yield running


@pytest.fixture
def http(proxy: RunningProxy) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=proxy.base_url, timeout=30) as client:
        yield client


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


def _sid() -> str:
    return f"h-{uuid.uuid4().hex[:10]}"


def _session_works(http: httpx.Client, sid: str) -> None:
    """A call on the session answers, and so does its end."""
    call = http.post("/v1/chat/completions", json=_body(), headers={"X-Talaria-Session-Id": sid})
    assert call.status_code == 200, call.text
    assert http.post(f"/v1/sessions/{sid}/end").status_code in (200, 404)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e308", "-1", "9" * 400, "0x10"])
def test_a_bad_tool_gap_header_is_a_400_and_the_session_survives(
    http: httpx.Client, value: str
) -> None:
    sid = _sid()
    assert _session_works_first(http, sid)
    bad = http.post(
        "/v1/chat/completions",
        json=_body(),
        headers={"X-Talaria-Session-Id": sid, "X-Talaria-Tool-Gap-Ms": value},
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Talaria-Tool-Gap-Ms"
    _session_works(http, sid)


def _session_works_first(http: httpx.Client, sid: str) -> bool:
    call = http.post("/v1/chat/completions", json=_body(), headers={"X-Talaria-Session-Id": sid})
    return call.status_code == 200


@pytest.mark.parametrize(
    "hint",
    [
        '{"expected_s": 1e300}',
        '{"expected_s": Infinity}',
        '{"expected_s": NaN}',
        '{"expected_ms": 1e20}',
        '{"expected_s": -1}',
        '{"tool": "a\\u0000b"}',
        '{"tool": "line\\r\\nbreak"}',
        '{"expected_s": "soon"}',
        "[1, 2]",
    ],
)
def test_a_bad_hint_is_a_4xx_and_the_session_survives(http: httpx.Client, hint: str) -> None:
    sid = _sid()
    assert _session_works_first(http, sid)
    response = http.post(
        f"/v1/sessions/{sid}/hints", content=hint, headers={"content-type": "application/json"}
    )
    assert response.status_code in (400, 422), response.text
    assert "error" in response.json()
    _session_works(http, sid)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_body(tool_choice={"function": "x"}), "tool_choice"),
        (_body(tool_choice={"type": "function", "function": ["x"]}), "tool_choice"),
        (
            _body(
                messages=[
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "tool_calls": [{"function": ["a"]}]},
                ]
            ),
            "messages",
        ),
        (_body(messages=[{"role": "user", "content": {"nested": True}}]), "messages"),
        (_body(max_tokens=1e300), "max_tokens"),
        (_body(temperature="hot"), "temperature"),
        (_body(prompt_cache_key="emoji 🙂"), "prompt_cache_key"),
        (_body(prompt_cache_key="rtl\u202e"), "prompt_cache_key"),
        (_body(prompt_cache_key="nul\x00"), "prompt_cache_key"),
        (_body(litellm_session_id="cr\r\nx-evil: 1"), "litellm_session_id"),
    ],
)
def test_malformed_bodies_are_4xx_in_openai_format(
    http: httpx.Client, body: dict[str, Any], param: str
) -> None:
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code in (400, 422), response.text
    error = response.json()["error"]
    assert param in (error["param"] or "") + error["message"]
    assert "x-talaria-session-id" not in response.headers  # nothing ran, nothing echoed


@pytest.mark.parametrize(
    ("depth", "refusal"),
    [(10_000, "nests too deeply"), (100_000, "more than 65,536 objects, arrays")],
)
def test_a_deeply_nested_body_is_a_400(http: httpx.Client, depth: int, refusal: str) -> None:
    """Past the parser's depth; deeper, past the body's bound on arrays (counted unparsed)."""
    response = http.post(
        "/v1/chat/completions",
        content=b"[" * depth + b"]" * depth,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400 and refusal in response.json()["error"]["message"]


def test_a_long_parent_session_id_is_a_400(http: httpx.Client) -> None:
    response = http.post(
        "/v1/chat/completions",
        json=_body(),
        headers={"X-Talaria-Session-Id": _sid(), "X-Talaria-Parent-Session-Id": "p" * 5000},
    )
    assert response.status_code == 400


HEADER_TEXT = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=60,
)
HINT_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    headers=st.dictionaries(
        st.sampled_from(
            [
                "X-Talaria-Tool-Gap-Ms",
                "X-Talaria-Session-Final",
                "X-Talaria-Parent-Session-Id",
                "X-Claude-Code-Session-Id",
                "session-id",
                "x-session-id",
            ]
        ),
        HEADER_TEXT,
        max_size=4,
    ),
    hint=st.dictionaries(st.sampled_from(["expected_s", "expected_ms", "tool"]), HINT_VALUES),
)
def test_arbitrary_headers_and_hints_never_break_a_session(
    http: httpx.Client, headers: dict[str, str], hint: dict[str, Any]
) -> None:
    """Whatever header values and hint bodies a client sends on a session, each request gets
    an answer below 500, and the session then still takes calls and ends."""
    sid = _sid()
    raw_headers = {k: v.encode("latin-1") for k, v in headers.items()}
    call = http.post(
        "/v1/chat/completions",
        json=_body(),
        headers={"X-Talaria-Session-Id": sid, **raw_headers},  # type: ignore[dict-item]
    )
    assert call.status_code < 500, call.text
    hinted = http.post(
        f"/v1/sessions/{sid}/hints",
        content=json.dumps(hint, allow_nan=True),
        headers={"content-type": "application/json"},
    )
    assert hinted.status_code < 500, hinted.text
    _session_works(http, sid)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schema=SCHEMAS, api=st.sampled_from(["chat-tool", "chat-format", "messages", "responses"]))
def test_arbitrary_tool_and_format_schemas_are_answered_below_500(
    http: httpx.Client, schema: Any, api: str
) -> None:
    """Whatever schema a tool or response format carries (huge minimums, recursive $refs, big
    literals), the call is answered — served, or refused with a 400 — never a 5xx or a hang,
    and /healthz answers after it."""
    user = [{"role": "user", "content": "list the files"}]
    if api == "chat-tool":
        tool = {"type": "function", "function": {"name": "ls", "parameters": schema}}
        path, body = "/v1/chat/completions", {"model": MODEL, "messages": user, "tools": [tool]}
    elif api == "chat-format":
        fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}
        path, body = "/v1/chat/completions", _body(response_format=fmt)
    elif api == "messages":
        tool = {"name": "ls", "input_schema": schema}
        path, body = "/v1/messages", {"model": MODEL, "max_tokens": 64, "messages": user,
                                      "tools": [tool]}  # fmt: skip
    else:
        tool = {"type": "function", "name": "ls", "parameters": schema}
        path, body = "/v1/responses", {"model": MODEL, "input": "ls", "tools": [tool]}
    answer = http.post(path, content=json.dumps(body, allow_nan=True),
                       headers={"content-type": "application/json"})  # fmt: skip
    assert answer.status_code < 500, answer.text
    assert http.get("/healthz").status_code == 200


def test_two_tenants_with_one_session_id_never_meet(tmp_path: Path) -> None:
    """Tenants A and B both call their session "task-1" with the same prompt: two sessions,
    and B's first call finds none of A's prefix in the cache (cached_tokens 0 where A's own
    continuation gets its history back). B cannot end, hint or read A's session. The admin API
    does not pick one of the two by the shared id: 409 naming both tenants, or ``?tenant=``."""
    url = f"sqlite+aiosqlite:///{tmp_path}/t.db"

    async def keys() -> tuple[str, str]:
        from talaria.proxy.store.migrate import upgrade_async

        await upgrade_async(url)
        engine = make_engine(url)
        store = SqlStore(make_sessionmaker(engine))
        try:
            a = await store.tenants.create_api_key(await store.tenants.create_tenant("tenant-a"))
            b = await store.tenants.create_api_key(await store.tenants.create_tenant("tenant-b"))
        finally:
            await engine.dispose()
        return a, b

    key_a, key_b = asyncio.run(keys())
    history = [{"role": "user", "content": "secret plan " * 200}]
    settings = ProxySettings(database_url=url, admin_token=ADMIN, models=[MODEL], time_scale=SCALE)
    with (
        running_proxy(settings) as running,
        httpx.Client(base_url=running.base_url, timeout=30) as http,
    ):

        def call(key: str, messages: list[dict[str, Any]]) -> httpx.Response:
            return http.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": messages},
                headers={"Authorization": f"Bearer {key}", "X-Talaria-Session-Id": "task-1"},
            )

        first_a = call(key_a, history)
        assert first_a.status_code == 200
        reply = first_a.json()["choices"][0]["message"]
        again_a = call(key_a, [*history, reply, {"role": "user", "content": "go on"}])
        first_b = call(key_b, history)
        assert again_a.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert first_b.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert first_a.headers["x-talaria-session-key"] != first_b.headers["x-talaria-session-key"]
        b_auth = {"Authorization": f"Bearer {key_b}"}
        # B ends its own "task-1", never A's
        assert http.post("/v1/sessions/task-1/end", headers=b_auth).json()["ended"] is True
        assert http.post("/v1/sessions/task-1/end", headers=b_auth).json()["ended"] is False
        assert call(key_a, [*history, reply, {"role": "user", "content": "more"}]).is_success
        a_key = first_a.headers["x-talaria-session-key"]
        hint = http.post(f"/v1/sessions/{a_key}/hints", json={"expected_s": 5}, headers=b_auth)
        assert hint.status_code == 404  # A's session, even named by its key, is not B's
        listed = http.get("/admin/sessions?tenant=tenant-a", headers=AUTH).json()["data"]
        keys = {s["session_key"] for s in listed}  # A's (a branch of it is a child), never B's
        assert a_key in keys and first_b.headers["x-talaria-session-key"] not in keys
        # the admin reads "task-1": whose? Not a silent pick: 409 naming both, or ?tenant=
        both = http.get("/admin/sessions/task-1", headers=AUTH)
        assert both.status_code == 409, both.text
        error = both.json()["error"]
        assert error["code"] == "ambiguous_session" and error["param"] == "tenant"
        assert "tenant-a (id " in error["message"] and "tenant-b (id " in error["message"]
        for tenant, key in (
            ("tenant-a", a_key),
            ("tenant-b", first_b.headers["x-talaria-session-key"]),
        ):
            picked = http.get(f"/admin/sessions/task-1?tenant={tenant}", headers=AUTH)
            assert picked.json()["session"]["session_key"] == key, picked.text
        tenant_b = http.get(f"/admin/sessions/{a_key}?tenant=tenant-b", headers=AUTH)
        assert tenant_b.status_code == 404  # a key of another tenant than the one asked


def test_durations_are_wall_seconds_under_a_scaled_clock(http: httpx.Client) -> None:
    """The simulated engine runs SCALE× faster than real time; the durations the admin API and
    the metrics report are the wall seconds that passed, not SCALE× more."""
    sid = _sid()
    started = time.monotonic()
    response = http.post(
        "/v1/chat/completions",
        json=_body(max_tokens=64, messages=[{"role": "user", "content": "word " * 3000}]),
        headers={"X-Talaria-Session-Id": sid},
    )
    elapsed = time.monotonic() - started
    assert response.status_code == 200
    call = http.get(f"/admin/sessions/{sid}", headers=AUTH).json()["calls"][0]
    engine_s = call["queue_s"] + call["prefill_s"] + call["decode_s"]
    assert 0 < engine_s <= elapsed
    # the engine's own split of the same call, in wall seconds too, inside the runtime's
    first_step = call["engine_intake_s"] + call["engine_queue_s"] + call["engine_prefill_s"]
    assert 0 < first_step == pytest.approx(call["prefill_s"])  # the simulated engine: no lag
    assert 0 < call["engine_decode_s"] == pytest.approx(call["decode_s"])


def test_a_utf8_session_header_is_a_400_not_mojibake(http: httpx.Client) -> None:
    response = http.post(
        "/v1/chat/completions",
        json=_body(),
        headers={"X-Talaria-Session-Id": "caf\u00e9".encode()},  # type: ignore[dict-item]
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "X-Talaria-Session-Id"


def test_a_chunked_body_over_the_limit_is_refused_while_it_is_read() -> None:
    """A body without Content-Length is counted as it arrives: 413 once it passes the limit,
    without reading (or holding) the rest."""
    from fastapi import Request

    from talaria.proxy.callpath.context import read_json
    from talaria.proxy.contract.errors import ApiError

    sent = 0
    chunk = b"x" * 65536

    async def receive() -> dict[str, Any]:  # 20 MB in 64 KiB chunks
        nonlocal sent
        sent += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": sent < 20_000_000}

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    request = Request(scope, receive)
    with pytest.raises(ApiError) as refused:
        asyncio.run(read_json(request, max_bytes=1_000_000))
    assert refused.value.status == 413
    assert sent <= 1_000_000 + len(chunk)
