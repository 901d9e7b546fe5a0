"""Malformed bodies that once answered 500 (found by tests/integration/test_fuzz_openapi.py and
by reading the parsers around what it found) are refused with a 400 in the API's own envelope,
with ``x-request-id``; and the well-formed neighbours of each are still served."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from talaria.proxy.contract.settings import ProxySettings
from talaria.runtime.instant import InstantRuntime
from tests.integration.server import RunningProxy, running_proxy

MODEL = "bench-model"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("bad-bodies")
    cfg = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp}/b.db", admin_token="admin-secret-token"
    )
    with running_proxy(cfg, runtimes=[InstantRuntime((MODEL,), output_tokens=4)]) as running:
        yield running


def _user(*blocks: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages body whose user turn is ``blocks``."""
    return {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [*blocks]}]}


def _result(content: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": "t1", "content": content}


def _namespace(tools: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": "hi", "tools": [{"type": "namespace", "tools": tools}]}


_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}


def _user_thinking(thinking: Any, max_tokens: int = 2048) -> dict[str, Any]:
    return {
        **_user({"type": "text", "text": "think"}),
        "max_tokens": max_tokens,
        "thinking": thinking,
    }


def _thinking(budget: Any, max_tokens: int) -> dict[str, Any]:
    return _user_thinking({"type": "enabled", "budget_tokens": budget}, max_tokens)


def _count(**fields: Any) -> dict[str, Any]:
    """A count_tokens body (a Messages body without max_tokens) with ``fields``."""
    return {"model": MODEL, "messages": [{"role": "user", "content": "x"}], **fields}


RESULT_CONTENT = "messages.0.content.0.content"
"""Where a tool_result's content is, in the error."""

LONE = '"\\ud800"'
"""A JSON string escape that decodes to a lone surrogate, which no UTF-8 encoder takes."""

# (path, JSON text of the body, status, a fragment of the error message)
CASES: list[tuple[str, str, int, str]] = [
    # tool_result content neither a string nor a list of blocks (fuzz: count_tokens, messages)
    ("/v1/messages", json.dumps(_user(_result(0.25))), 400, RESULT_CONTENT),
    (
        "/v1/messages/count_tokens",
        json.dumps(_user(_result(5))),
        400,
        "messages.0.content.0.content",
    ),
    (
        "/v1/messages",
        json.dumps(_user(_result({"type": "text"}))),
        400,
        "messages.0.content.0.content",
    ),
    ("/v1/messages", json.dumps(_user(_result([1]))), 400, RESULT_CONTENT),
    ("/v1/messages", json.dumps(_user(_result([{"type": "text", "text": "ok"}]))), 200, ""),
    ("/v1/messages", json.dumps(_user(_result(None))), 200, ""),
    # a document's source.content not text or blocks (fuzz: messages), its source not an object
    (
        "/v1/messages",
        json.dumps(_user({"type": "document", "source": {"type": "", "content": 0}})),
        400,
        "messages.0.content.0.source.content",
    ),
    (
        "/v1/messages",
        json.dumps(_user({"type": "document", "source": "s"})),
        400,
        "source: Input should be a valid dictionary",
    ),
    (
        "/v1/messages",
        json.dumps(_user({"type": "document", "source": {"type": "content", "content": "ok"}})),
        200,
        "",
    ),
    ("/v1/messages", json.dumps(_user({"type": "document", "source": None})), 200, ""),
    # an image's source not an object
    (
        "/v1/messages",
        json.dumps(_user({"type": "image", "source": "x"})),
        400,
        "source: Input should be a valid dictionary",
    ),
    (
        "/v1/messages",
        json.dumps(_user({"type": "image", "source": [1]})),
        400,
        "messages.0.content.0.source",
    ),
    (
        "/v1/messages",
        json.dumps(_user({"type": "image", "source": {"type": "url", "url": "http://x/a.png"}})),
        200,
        "",
    ),
    # a Responses namespace whose tools are not a list of tools (fuzz: responses)
    ("/v1/responses", json.dumps(_namespace("ab")), 400, "tools.0.tools"),
    ("/v1/responses", json.dumps(_namespace(5)), 400, "tools.0.tools"),
    ("/v1/responses", json.dumps(_namespace({"a": 1})), 400, "tools.0.tools"),
    ("/v1/responses", json.dumps(_namespace([1])), 400, "tools.0.tools"),
    ("/v1/responses", json.dumps(_namespace([{"type": "function", "name": "f"}])), 200, ""),
    ("/v1/responses", json.dumps(_namespace(None)), 200, ""),
    # a lone surrogate in any string of any body
    (
        "/v1/chat/completions",
        f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": {LONE}}}]}}',
        400,
        "not Unicode text",
    ),
    ("/v1/completions", f'{{"model": "{MODEL}", "prompt": {LONE}}}', 400, "not Unicode text"),
    (
        "/v1/messages",
        f'{{"model": "{MODEL}", "max_tokens": 5, "system": {LONE}, "messages": []}}',
        400,
        "not Unicode text",
    ),
    ("/v1/messages/count_tokens", f'{{"model": {LONE}}}', 400, "not Unicode text"),
    (
        "/v1/responses",
        f'{{"model": "{MODEL}", "input": "hi", "previous_response_id": {LONE}}}',
        400,
        "not Unicode text",
    ),
    ("/v1/sessions/s1/hints", f'{{"tool": {LONE}}}', 400, "not Unicode text"),
    (
        "/v1/chat/completions",
        f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "\\ud83d\\ude00"}}]}}',
        200,
        "",
    ),  # a surrogate pair is one character (an emoji)
    # lenient 200s of the security review (finding 6.5): a thinking budget Anthropic refuses
    ("/v1/messages", json.dumps(_thinking(-1, 2048)), 400, "at least 1024"),
    ("/v1/messages", json.dumps(_thinking(1023, 2048)), 400, "at least 1024"),
    ("/v1/messages", json.dumps(_thinking("2000", 4096)), 400, "at least 1024"),
    ("/v1/messages", json.dumps(_thinking(2048, 2048)), 400, "less than max_tokens"),
    ("/v1/messages", json.dumps(_thinking(1024, 2048)), 200, ""),
    ("/v1/messages", json.dumps(_thinking(1024.0, 2048)), 200, ""),  # JSON schema's integer
    ("/v1/messages", json.dumps(_thinking(1024.5, 2048)), 400, "at least 1024"),
    # Python writes inf as the token Infinity, which is not JSON (RFC 8259): refused as such
    ("/v1/messages", json.dumps(_thinking(float("inf"), 2048)), 400, "not valid JSON"),
    ("/v1/messages", json.dumps(_thinking(True, 2048)), 400, "at least 1024"),
    (
        "/v1/messages",
        json.dumps(_user_thinking({"type": "sometimes"})),
        400,
        "'disabled' or 'adaptive'",
    ),
    ("/v1/messages", json.dumps(_user_thinking({"type": "adaptive"})), 200, ""),
    # stream must be a JSON boolean on every API (pydantic's lax mode took "yes", 1, "true")
    *[
        (path, json.dumps({**body, "stream": value}), status, "stream")
        for path, body, status in (
            ("/v1/chat/completions", _CHAT, 422),
            ("/v1/completions", {"model": MODEL, "prompt": "x"}, 422),
            ("/v1/messages", _user({"type": "text", "text": "x"}), 400),
            ("/v1/responses", {"model": MODEL, "input": "x"}, 400),
        )
        for value in ("yes", "true", 1)
    ],
    ("/v1/chat/completions", json.dumps({**_CHAT, "stream": False}), 200, ""),
    ("/v1/chat/completions", json.dumps({**_CHAT, "logprobs": "no"}), 422, "logprobs"),
    ("/v1/responses", json.dumps({"model": MODEL, "input": "x", "store": 0}), 400, "store"),
    # count_tokens: validated as a Messages request without max_tokens
    ("/v1/messages/count_tokens", json.dumps({"model": MODEL, "messages": []}), 400, "messages"),
    ("/v1/messages/count_tokens", json.dumps(_count(stream="yes")), 400, "stream"),
    ("/v1/messages/count_tokens", json.dumps(_count(temperature=5)), 400, "temperature"),
    (
        "/v1/messages/count_tokens",
        json.dumps(_count(tool_choice={"type": "x"})),
        400,
        "tool_choice",
    ),
    (
        "/v1/messages/count_tokens",
        json.dumps(_count(tool_choice={"type": "tool", "name": "absent"})),
        400,
        "not among the tools",
    ),
    (
        "/v1/messages/count_tokens",
        json.dumps(_count(thinking={"type": "enabled", "budget_tokens": -1})),
        400,
        "at least 1024",
    ),
    ("/v1/messages/count_tokens", json.dumps(_count(messages=[{"role": "x"}])), 400, "messages"),
    (
        "/v1/messages/count_tokens",
        json.dumps(_count(thinking={"type": "enabled", "budget_tokens": 4096})),
        200,
        "",
    ),  # no max_tokens to be less than
]


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_bad_body(proxy: RunningProxy, path: str, body: str, status: int, fragment: str) -> None:
    reply = httpx.post(
        proxy.base_url + path, content=body, headers={"content-type": "application/json"}
    )
    assert reply.status_code == status, reply.text
    assert reply.headers.get("x-request-id")
    if status == 200:
        return
    data = reply.json()
    if path.startswith("/v1/messages"):
        assert data["type"] == "error"
        assert data["error"]["type"] == "invalid_request_error"
    else:
        assert data["error"]["type"] == "invalid_request_error"
        assert data["error"]["code"] == "invalid_value"
    assert fragment in data["error"]["message"]


DEEP = "[" * 10_000 + "]" * 10_000
"""JSON text nesting deeper than Python's ``json`` follows (RecursionError, not ValueError),
within the body's bound on brackets (proxy/callpath/bounds.py, those in strings count too)."""


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/messages",
            {
                "model": MODEL,
                "max_tokens": 5,
                "metadata": {"user_id": '{"a": ' + DEEP + "}"},
                "messages": [{"role": "user", "content": "hi"}],
            },
        ),
        (
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": DEEP}}],
                    },
                ],
            },
        ),
    ],
    ids=["metadata.user_id", "tool-call-arguments"],
)
def test_deeply_nested_json_text(proxy: RunningProxy, path: str, body: dict[str, Any]) -> None:
    """JSON text inside a string field (Claude Code's ``metadata.user_id``, tool-call
    arguments) that nests too deep to read is taken as plain text (a ``user_id`` this long is
    not read at all): the call is answered."""
    reply = httpx.post(proxy.base_url + path, json=body)
    assert reply.status_code == 200, reply.text


def test_interleaved_thinking_may_budget_past_max_tokens(proxy: RunningProxy) -> None:
    """With the interleaved-thinking beta the budget spans the whole turn (Anthropic's rule),
    so it may reach max_tokens; without it, 400."""
    body = _thinking(4096, 2048)
    beta = {"anthropic-beta": "interleaved-thinking-2025-05-14,fine-grained-tool-streaming"}
    assert httpx.post(proxy.base_url + "/v1/messages", json=body, headers=beta).is_success
    assert httpx.post(proxy.base_url + "/v1/messages", json=body).status_code == 400
