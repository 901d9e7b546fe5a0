"""A sub-agent goes where its parent's KV is: the real ``openai`` and ``anthropic`` clients over
real HTTP against a proxy with two embedded simulated nodes hosting the same model (500× real
time). A parent session runs a call; then a child naming it (OpenCode's ``x-session-id`` +
``x-parent-session-id``, or Claude Code's agent id under the parent's session id) with the
same system prompt and tools and its own user message is routed to the parent's instance for
the ``parent_kv`` scorer (reason ``kv-parent``), and the engine reuses the parent's KV for the
shared prefix (``cached_tokens`` on the child's first call). A child with other tools, or of
no parent, shares nothing (proxy/sessions/lineage.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from talaria.proxy.contract.settings import ProxySettings
from tests.integration.server import RunningProxy, running_proxy

ADMIN = "subagent-admin-token"
MODEL = "glm-4.5-fp8"
NODES = {"node0", "node1"}
SYSTEM = "You are a careful coding agent working in a large repository. " * 60
"""About 700 tokens: many KV blocks, most of the child's prompt."""
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
READ = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("subagents")
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp}/proxy.db",
        admin_token=ADMIN,
        time_scale=500.0,
        nodes=2,
    )
    with running_proxy(settings) as running:
        yield running


@pytest.fixture
def client(proxy: RunningProxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _first_call(proxy: RunningProxy, session_key: str) -> dict[str, Any]:
    """The session's first call in the admin timeline, with its routing decision."""
    reply = httpx.get(
        f"{proxy.base_url}/admin/sessions/{session_key}",
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert reply.status_code == 200, reply.text
    calls: list[dict[str, Any]] = reply.json()["calls"]
    return calls[0]


def _call(
    client: openai.OpenAI, user: str, headers: dict[str, str], tools: list[Any]
) -> tuple[str, str, int]:
    """(instance, session key, cached tokens) of one chat call."""
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        tools=tools,
        max_tokens=16,
        extra_headers=headers,
    )
    usage = raw.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    return raw.headers["x-talaria-instance"], raw.headers["x-talaria-session-key"], cached


def _opencode(parent: str) -> tuple[dict[str, str], dict[str, str]]:
    child = _id("child")
    return {"x-session-id": parent}, {"x-session-id": child, "x-parent-session-id": parent}


def _claude_code(parent: str) -> tuple[dict[str, str], dict[str, str]]:
    agent = _id("agent")
    return (
        {"X-Claude-Code-Session-Id": parent},
        {"X-Claude-Code-Session-Id": parent, "x-claude-code-agent-id": agent},
    )


@pytest.mark.parametrize("headers", [_opencode, _claude_code], ids=["opencode", "claude-code"])
def test_a_child_runs_where_its_parent_s_kv_is_and_reuses_its_prefix(
    proxy: RunningProxy, client: openai.OpenAI, headers: Any
) -> None:
    parent_headers, child_headers = headers(_id("parent"))
    home, parent_key, _ = _call(client, "Fix the failing build in src/.", parent_headers, [BASH])
    assert home in NODES

    instance, child_key, cached = _call(
        client, "Find where the build flags are set.", child_headers, [BASH]
    )
    assert child_key != parent_key
    first = _first_call(proxy, child_key)
    scores = first["routing_scores"]
    assert set(scores) == NODES
    assert scores[home]["parent_kv"] > 0.5  # the system prompt and tools: most of the prompt
    assert scores[(NODES - {home}).pop()]["parent_kv"] == 0.0
    assert first["routing_reason"] == "kv-parent"
    assert instance == first["instance"] == home
    # The engine reused the parent's KV for the shared prefix (whole blocks of it).
    assert 0 < cached < first["prompt_tokens"]
    assert first["cached_tokens"] == cached


def test_a_child_with_other_tools_shares_nothing(
    proxy: RunningProxy, client: openai.OpenAI
) -> None:
    parent_headers, child_headers = _opencode(_id("parent"))
    _call(client, "Fix the failing build in src/.", parent_headers, [BASH])
    _, child_key, cached = _call(client, "Read the build script.", child_headers, [BASH, READ])
    first = _first_call(proxy, child_key)
    assert {node: s["parent_kv"] for node, s in first["routing_scores"].items()} == {
        "node0": 0.0,
        "node1": 0.0,
    }
    assert first["routing_reason"] != "kv-parent"
    assert cached == 0  # the tools render first: nothing after them matches


def test_a_root_with_the_same_prompt_is_no_child(
    proxy: RunningProxy, client: openai.OpenAI
) -> None:
    """Only a parent the request names counts: an unrelated session with the same system prompt
    and tools gets no parent_kv score (it is not told whose KV it could share)."""
    _call(client, "Fix the failing build in src/.", {"x-session-id": _id("parent")}, [BASH])
    _, key, _ = _call(client, "Find the flags.", {"x-session-id": _id("stranger")}, [BASH])
    first = _first_call(proxy, key)
    assert all(s["parent_kv"] == 0.0 for s in first["routing_scores"].values())


def test_a_claude_code_sub_agent_over_the_messages_api(proxy: RunningProxy) -> None:
    """Claude Code itself: the Messages API, the system prompt as ``system``, Anthropic tools."""
    client = anthropic.Anthropic(base_url=proxy.base_url, api_key="x", max_retries=0)
    session, agent = _id("cc"), _id("agent")
    tools: Any = [
        {
            "name": "bash",
            "description": "Run a shell command.",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
        }
    ]

    def call(user: str, headers: dict[str, str]) -> tuple[str, str, int]:
        raw = client.messages.with_raw_response.create(
            model=MODEL,
            system=SYSTEM,
            messages=[{"role": "user", "content": user}],
            tools=tools,
            max_tokens=16,
            extra_headers=headers,
        )
        usage = raw.parse().usage
        cached = usage.cache_read_input_tokens or 0
        return raw.headers["x-talaria-instance"], raw.headers["x-talaria-session-key"], cached

    home, _, _ = call("Fix the failing build.", {"X-Claude-Code-Session-Id": session})
    instance, child_key, cached = call(
        "Find the build flags.",
        {"X-Claude-Code-Session-Id": session, "x-claude-code-agent-id": agent},
    )
    first = _first_call(proxy, child_key)
    assert first["routing_reason"] == "kv-parent"
    assert instance == home and cached > 0
