"""A session is what the agent says it is, over HTTP with the real ``openai`` client: the
identity table's aliases and parents (Dynamo's headers, a final header that ends the session,
OpenCode's ``x-session-affinity``, an operator's own header), an explicit id that keeps a
compacted history in the same session, and an implicit session that survives a discarded
reply followed by a correction, with cached tokens."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from talaria.proxy.contract.settings import ProxySettings
from tests.integration.server import RunningProxy, running_proxy

MODEL = "glm-4.5-fp8"
ADMIN = "admin-secret-token"
SYSTEM = {"role": "system", "content": "You are a coding agent. Always call a tool. " * 20}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    tmp: Path = tmp_path_factory.mktemp("identity")
    cfg = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp}/p.db",
        admin_token=ADMIN,
        time_scale=500.0,
        session_headers="x-acme-run",  # an operator's own session header
    )
    with running_proxy(cfg) as running:
        yield running


@pytest.fixture
def client(proxy: RunningProxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.v1, api_key="anything", max_retries=0)


def _call(client: openai.OpenAI, messages: list[Any], **headers: str) -> Any:
    return client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, extra_headers=headers
    )


def test_a_correction_after_a_discarded_reply_continues_an_implicit_session(
    client: openai.OpenAI, proxy: RunningProxy
) -> None:
    task = {"role": "user", "content": f"fix the failing test {uuid.uuid4().hex} " * 30}
    first = _call(client, [SYSTEM, task])
    correction = {"role": "user", "content": "No tool calls found in the response; call one."}
    again = _call(client, [SYSTEM, task, correction])  # the reply dropped, a correction added
    assert again.headers["x-talaria-session-key"] == first.headers["x-talaria-session-key"]
    assert again.headers["x-talaria-session-how"] == "corrected"
    assert again.parse().usage.prompt_tokens_details.cached_tokens > 0
    detail = proxy.admin(f"/admin/sessions/{first.headers['x-talaria-session-key']}")
    assert detail["session"]["calls"] == 2 and detail["children"] == []
    assert sorted(c["how"] for c in detail["calls"]) == ["corrected", "new"]


def test_a_compacted_history_under_an_id_stays_in_the_session(
    client: openai.OpenAI, proxy: RunningProxy
) -> None:
    sid = f"run-{uuid.uuid4().hex[:8]}"
    messages: list[Any] = [SYSTEM, {"role": "user", "content": "refactor the parser " * 30}]
    first = _call(client, messages, **{"x-talaria-session-id": sid})
    messages += [first.parse().choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "user", "content": "go on"}]
    assert (
        _call(client, messages, **{"x-talaria-session-id": sid}).headers["x-talaria-session-how"]
        == "continued"
    )
    summary = [SYSTEM, {"role": "user", "content": "Summary of the work so far: parser split."}]
    compacted = _call(client, summary, **{"x-talaria-session-id": sid})
    assert compacted.headers["x-talaria-session-how"] == "compacted"
    detail = proxy.admin(f"/admin/sessions/{sid}")
    assert detail["session"]["calls"] == 3 and detail["children"] == []
    calls = sorted(detail["calls"], key=lambda c: c["call_index"])
    assert [(c["how"], c["thread"]) for c in calls] == [
        ("new", 0), ("continued", 0), ("compacted", 1)
    ]  # fmt: skip
    listed = proxy.admin("/admin/sessions?limit=1000")["data"]
    assert [s["session_id"] for s in listed].count(sid) == 1


@pytest.mark.parametrize("header", ["x-session-affinity", "x-acme-run"])
def test_opencodes_affinity_header_and_an_operators_own_name_the_session(
    client: openai.OpenAI, proxy: RunningProxy, header: str
) -> None:
    """OpenCode's ``x-session-affinity`` (built in) and ``x-acme-run`` (TALARIA_SESSION_HEADERS):
    two conversations under one value are one session, recorded with that source."""
    sid = f"{header}-{uuid.uuid4().hex[:8]}"
    for task in ("plan the change ", "now write the tests "):
        reply = _call(client, [SYSTEM, {"role": "user", "content": task * 30}], **{header: sid})
        assert reply.headers["x-talaria-session-id"] == sid
    session = proxy.admin(f"/admin/sessions/{sid}")["session"]
    assert (session["identity_source"], session["calls"]) == (header, 2)
    assert session["agent"] == "openai"  # the openai client's User-Agent: OpenAI/Python


def test_dynamo_headers_name_the_session_its_parent_and_its_end(
    client: openai.OpenAI, proxy: RunningProxy
) -> None:
    sid = f"dyn-{uuid.uuid4().hex[:8]}"
    task = [SYSTEM, {"role": "user", "content": "plan the change " * 30}]
    root = _call(client, task, **{"X-Dynamo-Session-ID": sid})
    assert root.headers["x-talaria-session-id"] == sid
    sub = [SYSTEM, {"role": "user", "content": "read the tests " * 30}]
    child = _call(
        client, sub, **{"X-Dynamo-Session-ID": f"{sid}-sub", "X-Dynamo-Parent-Session-ID": sid}
    )
    assert child.headers["x-talaria-session-how"] == "child"
    detail = proxy.admin(f"/admin/sessions/{sid}")
    assert detail["session"]["identity_source"] == "dynamo"
    assert [c["session_id"] for c in detail["children"]] == [f"{sid}-sub"]
    rows = [r for r in proxy.admin("/admin/sessions?limit=1000")["data"] if sid in r["session_id"]]
    assert [(r["session_id"], r["children"], r["family"]["calls"]) for r in rows] == [(sid, 1, 2)]
    _call(client, task, **{"X-Dynamo-Session-ID": sid, "X-Dynamo-Session-Final": "true"})
    ended = proxy.admin(f"/admin/sessions/{sid}")["session"]
    assert ended["state"] == "ended" and ended["end_reason"] == "final"


def test_a_volatile_system_prompt_line_is_counted_as_prefix_drift(
    client: openai.OpenAI, proxy: RunningProxy
) -> None:
    sid = f"drift-{uuid.uuid4().hex[:8]}"
    system = {"role": "system", "content": "You are a coding agent. Time: 12:00. " * 20}
    messages: list[Any] = [system, {"role": "user", "content": "fix the bug " * 30}]
    for _ in range(2):
        reply = _call(client, messages, **{"x-talaria-session-id": sid}).parse()
        messages += [
            reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "go on"},
        ]
    messages[0] = {"role": "system", "content": "You are a coding agent. Time: 12:01. " * 20}
    drifted = _call(client, messages, **{"x-talaria-session-id": sid})
    assert drifted.headers["x-talaria-session-how"] == "drifted"
    detail = proxy.admin(f"/admin/sessions/{sid}")
    last = max(detail["calls"], key=lambda c: c["call_index"])
    assert (last["how"], last["drift_at"], last["thread"]) == ("drifted", 0, 0)
    assert detail["session"]["calls"] == 3 and detail["children"] == []
    metrics = httpx.get(proxy.base_url + "/metrics", headers={"authorization": f"Bearer {ADMIN}"})
    assert "talaria_prefix_drift_total 1.0" in metrics.text
