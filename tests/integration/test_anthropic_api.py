"""The official ``anthropic`` client against the proxy's Messages API over real HTTP (uvicorn on a
loopback port, the embedded simulated runtime 500× faster than real time, a real SQLite file)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from talaria.proxy.contract.settings import ProxySettings
from tests.integration.server import RunningProxy, running_proxy

ADMIN = "admin-secret-token"
MODEL = "glm-4.5-fp8"
LIST_FILES = {
    "name": "list_files",
    "description": "List the files in a directory.",
    "input_schema": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "depth": {"type": "integer", "minimum": 1}},
        "required": ["path", "depth"],
    },
}
WRITE_FILE = {
    "name": "write_file",
    "description": "Write a file.",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("anthropic")
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp}/proxy.db", admin_token=ADMIN, time_scale=500.0
    )
    with running_proxy(settings) as running:
        yield running


@pytest.fixture
def client(proxy: RunningProxy) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.base_url, api_key="local", max_retries=0)


def _sid() -> str:
    return str(uuid.uuid4())


def test_create_with_system_blocks(client: anthropic.Anthropic) -> None:
    raw = client.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=64,
        system=[
            {"type": "text", "text": "You are terse."},
            {"type": "text", "text": "Answer in English.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[{"role": "user", "content": "hello"}],
        metadata={"user_id": "someone"},
        extra_body={"temperature": 0.2, "top_k": 40, "stop_sequences": ["\n\n\n"]},
    )
    assert raw.headers["x-talaria-session-id"] and raw.headers["x-request-id"]
    message = raw.parse()
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert message.content[0].type == "text"
    assert message.content[0].text.startswith("[simulated]")
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    assert message.usage.cache_read_input_tokens == 0


def test_stream_event_sequence(proxy: RunningProxy) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 32,
        "stream": True,
        "system": "be brief",
        "messages": [{"role": "user", "content": "hi"}],
    }
    with httpx.stream(
        "POST",
        proxy.base_url + "/v1/messages?beta=true",
        json=body,
        headers={"x-api-key": "local", "anthropic-version": "2023-06-01"},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        names = [line[7:] for line in response.iter_lines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}


def test_stream_helper_and_thinking(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model=MODEL,
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},  # Anthropic's least budget
        messages=[{"role": "user", "content": "think, then answer"}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking.startswith("[simulated reasoning]")
    assert final.content[0].signature
    assert text == final.content[1].text and text.startswith("[simulated]")


def test_tool_use_round_trips_in_one_session(
    client: anthropic.Anthropic, proxy: RunningProxy
) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "what is in this repo? " * 30}]
    replies = []
    for step in range(4):
        kwargs: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": 512,
            "tools": [WRITE_FILE, LIST_FILES],
            "messages": messages,
        }
        if step % 2:  # streamed and not, alternately
            with client.messages.stream(**kwargs) as stream:
                reply = stream.get_final_message()
        else:
            reply = client.messages.create(**kwargs)
        replies.append(reply)
        messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            break
        assert [u.name for u in uses] == ["list_files"]  # never the tool that writes
        jsonschema.validate(uses[0].input, LIST_FILES["input_schema"])
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": uses[0].id, "content": "a.py\nb.py"},
                    {"type": "text", "text": "go on"},
                ],
            }
        )
    assert [r.stop_reason for r in replies[:3]] == ["tool_use"] * 3
    assert replies[3].stop_reason in ("end_turn", "max_tokens")  # the final answer
    assert replies[0].usage.cache_read_input_tokens == 0
    assert all(r.usage.cache_read_input_tokens > 0 for r in replies[1:])
    sessions = proxy.admin("/admin/sessions?limit=50")["data"]
    mine = [s for s in sessions if s["calls"] == 4]
    assert len(mine) == 1 and mine[0]["identity_source"] == "implicit"
    detail = proxy.admin(f"/admin/sessions/{mine[0]['session_key']}")
    assert all(c["api"] == "messages" for c in detail["calls"])
    # A tool_use reply reserved the session's instance. At this proxy's time scale a
    # reservation lasts ~13 wall ms (6.4 clock s ÷ 500), so whether the client's next call came
    # back within it depends on the machine's load: both releases are correct.
    first = [r["release_reason"] for r in detail["reservations"]][:1]
    assert first in (["returned"], ["expired"])


def test_claude_code_identity_and_sub_agents(
    client: anthropic.Anthropic, proxy: RunningProxy
) -> None:
    sid = _sid()
    user_id = json.dumps({"device_id": "d", "account_uuid": "", "session_id": sid})
    main: list[dict[str, Any]] = [{"role": "user", "content": "fix the bug"}]
    first = client.messages.create(
        model=MODEL, max_tokens=32, messages=main, metadata={"user_id": user_id}
    )
    main += [
        {"role": "assistant", "content": first.content[0].text},
        {"role": "user", "content": "ok"},
    ]
    headers = {"X-Claude-Code-Session-Id": sid}
    client.messages.create(model=MODEL, max_tokens=32, messages=main, extra_headers=headers)
    side = [{"role": "user", "content": "write a title for this conversation"}]
    titled = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=32, messages=side, extra_headers=headers
    )  # another conversation under the same id: a thread of the session, not a child
    assert titled.headers["x-talaria-session-id"] == sid
    sub = [{"role": "user", "content": "search the code for the bug (sub-agent)"}]
    agent = {**headers, "x-claude-code-agent-id": f"{sid}-agent-1"}
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=32, messages=sub, extra_headers=agent
    )  # Claude Code names its sub-agents: a child
    assert raw.headers["x-talaria-session-id"] == f"{sid}-agent-1"
    detail = proxy.admin(f"/admin/sessions/{sid}")
    assert detail["session"]["identity_source"] == "claude-code"
    assert detail["session"]["agent"] == "anthropic"  # Anthropic/Python, the SDK's User-Agent
    assert detail["session"]["calls"] == 3
    assert titled.headers["x-talaria-session-key"] == detail["session"]["session_key"]
    [child] = detail["children"]
    assert child["session_key"] == raw.headers["x-talaria-session-key"] and child["calls"] == 1
    assert child["parent_session_key"] == detail["session"]["session_key"]


def test_count_tokens(client: anthropic.Anthropic) -> None:
    small = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    large = client.messages.count_tokens(
        model=MODEL,
        system="You are a coding agent.",
        messages=[{"role": "user", "content": "hi " * 400}],
        tools=[LIST_FILES],
    )
    assert 0 < small.input_tokens < large.input_tokens


@pytest.mark.parametrize(
    ("body", "status", "kind", "needle"),
    [
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, 400,
         "invalid_request_error", "max_tokens"),
        ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}, 400,
         "invalid_request_error", "messages.0.role"),
        ({"model": MODEL, "max_tokens": 5, "messages": []}, 400, "invalid_request_error",
         "messages"),
        ({"model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, 404,
         "not_found_error", "nope"),
        ({"model": MODEL, "max_tokens": 5, "tool_choice": {"type": "tool", "name": "ghost"},
          "messages": [{"role": "user", "content": "x"}]}, 400, "invalid_request_error", "ghost"),
        ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "content": "x"}]}]}, 400, "invalid_request_error",
         "tool_use_id"),
    ],
)  # fmt: skip
def test_errors_in_anthropics_envelope(
    proxy: RunningProxy, body: dict[str, Any], status: int, kind: str, needle: str
) -> None:
    reply = httpx.post(proxy.base_url + "/v1/messages", json=body, headers={"x-api-key": "k"})
    assert reply.status_code == status
    error = reply.json()
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert needle in error["error"]["message"]


def test_the_sdk_raises_its_own_error_types(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(
            model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model=MODEL, max_tokens=0, messages=[{"role": "user", "content": "x"}]
        )


def test_keys_by_x_api_key_or_bearer(tmp_path: Path) -> None:
    settings = ProxySettings(database_url=f"sqlite+aiosqlite:///{tmp_path}/k.db", api_keys=["k1"])
    with running_proxy(settings) as proxy:
        ask = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        good = anthropic.Anthropic(base_url=proxy.base_url, api_key="k1", max_retries=0)
        assert good.messages.create(**ask).content
        bearer = anthropic.Anthropic(base_url=proxy.base_url, auth_token="k1", max_retries=0)
        assert bearer.messages.create(**ask).content
        bad = anthropic.Anthropic(base_url=proxy.base_url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as info:
            bad.messages.create(**ask)
        assert info.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_models_list_in_anthropics_shape(client: anthropic.Anthropic) -> None:
    ids = [m.id for m in client.models.list()]
    assert MODEL in ids


def test_a_bad_session_id_in_metadata_is_refused(proxy: RunningProxy) -> None:
    user_id = json.dumps({"device_id": "d", "session_id": "evil\r\nx-injected: 1"})
    body = {
        "model": MODEL,
        "max_tokens": 5,
        "metadata": {"user_id": user_id},
        "messages": [{"role": "user", "content": "x"}],
    }
    reply = httpx.post(proxy.base_url + "/v1/messages", json=body, headers={"x-api-key": "k"})
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert "metadata.user_id" in reply.json()["error"]["message"]
    assert "x-injected" not in reply.headers
