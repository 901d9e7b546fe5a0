"""The call lanes (proxy/edge/lanes.py) answer every request exactly as FastAPI's routing does: the
same requests, sent to an app with lanes and to one without, get the same status, content
type, headers and body (less what is random or timed), and the same counts in
``talaria_requests_total``. A lane that skipped the edge middleware, an exception handler, the
route label or the dialect's error envelope differs from the routed app in one of them."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.dialects.chat import routes as chat_routes
from talaria.proxy.edge.app import create_app
from talaria.runtime.instant import InstantRuntime

MODEL = "lane-model"
KEY = "lane-test-key"
AUTH = {"authorization": f"Bearer {KEY}"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": MODEL, "input": "hi"}

# (name, method, path, extra headers, body: JSON value, raw bytes, or None)
CASES: list[tuple[str, str, str, dict[str, str], Any]] = [
    ("chat", "POST", "/v1/chat/completions", {"x-talaria-session-id": "s1"}, CHAT),
    ("chat stream", "POST", "/v1/chat/completions", {}, {**CHAT, "stream": True}),
    ("chat, a session's second call", "POST", "/v1/chat/completions",
     {"x-talaria-session-id": "s1", "x-talaria-session-final": "true"}, CHAT),
    ("completions", "POST", "/v1/completions", {}, {"model": MODEL, "prompt": "hi"}),
    ("messages", "POST", "/v1/messages", {}, MESSAGES),
    ("messages stream", "POST", "/v1/messages", {}, {**MESSAGES, "stream": True}),
    ("count_tokens", "POST", "/v1/messages/count_tokens", {},
     {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
    ("responses", "POST", "/v1/responses", {}, RESPONSES),
    ("not JSON", "POST", "/v1/chat/completions", {}, b"{not json"),
    ("not JSON, Anthropic's envelope", "POST", "/v1/messages", {}, b"[1,"),
    ("invalid field", "POST", "/v1/chat/completions", {}, {**CHAT, "max_tokens": -1}),
    ("unknown model", "POST", "/v1/chat/completions", {}, {**CHAT, "model": "nope"}),
    ("unknown model, Anthropic's envelope", "POST", "/v1/messages", {},
     {**MESSAGES, "model": "nope"}),
    ("malformed session id", "POST", "/v1/chat/completions",
     {"x-talaria-session-id": "x" * 5000}, CHAT),
    ("an internal header from a client", "POST", "/v1/chat/completions",
     {"x-talaria-forwarded-by": "peer"}, CHAT),
    ("too large", "POST", "/v1/chat/completions", {}, b"{" + b" " * 70_000 + b"}"),
    ("a method the route has not", "GET", "/v1/chat/completions", {}, None),
    ("a path with a slash more", "POST", "/v1/chat/completions/", {}, CHAT),
    ("no key", "POST", "/v1/chat/completions", {"authorization": ""}, CHAT),
]  # fmt: skip

RANDOM_HEADERS = {"x-request-id", "x-talaria-overhead-ms", "x-talaria-session-key", "date"}
RANDOM_HEADERS |= {"content-length"}  # a body's length varies with its timestamps' digits
RANDOM = re.compile(
    r'"(id|created|created_at|completed_at|call_id|item_id|response_id|msg_id)":\s*'
    r'("[^"]*"|\d+(\.\d+)?)'
)


def _comparable(response: Any) -> tuple[Any, ...]:
    """What must not differ: status, headers but the random ones, and the body with its ids
    and timestamps blanked (the lanes do not make the ids)."""
    headers = sorted(
        (k, _blank_ids(v)) for k, v in response.headers.items() if k not in RANDOM_HEADERS
    )
    body = _blank_ids(RANDOM.sub(lambda m: f'"{m.group(1)}":_', response.text))
    return response.status_code, headers, body


def _blank_ids(text: str) -> str:
    return re.sub(r"(chatcmpl|msg|resp|cmpl|toolu|call|ses)[_-]?[0-9a-f]{8,}", r"\1-_", text)


def _requests_total(client: TestClient) -> list[str]:
    text = client.get("/metrics").text
    return sorted(line for line in text.splitlines() if line.startswith("talaria_requests_total{"))


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[Callable[[bool], TestClient]]:
    opened: list[TestClient] = []

    def client(lanes: bool) -> TestClient:
        settings = ProxySettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path}/{'lanes' if lanes else 'routed'}.db",
            api_keys=[KEY],
            max_request_bytes=65_536,
        )
        app = create_app(settings, runtimes=[InstantRuntime((MODEL,))], call_lanes=lanes)
        opened.append(TestClient(app, raise_server_exceptions=False).__enter__())
        return opened[-1]

    yield client
    for c in opened:
        c.__exit__(None, None, None)


def _send(client: TestClient, method: str, path: str, headers: dict[str, str], body: Any) -> Any:
    content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    headers = {**AUTH, "content-type": "application/json", **headers}
    headers = {k: v for k, v in headers.items() if v}
    return client.request(method, path, headers=headers, content=content)


def test_lanes_serve_the_call_routes(clients: Callable[[bool], TestClient]) -> None:
    lanes = clients(True)
    assert set(lanes.app.lanes) == {  # type: ignore[attr-defined]
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
    }
    assert clients(False).app.lanes == {}  # type: ignore[attr-defined]


def test_every_request_is_answered_as_routing_answers_it(
    clients: Callable[[bool], TestClient],
) -> None:
    lanes, routed = clients(True), clients(False)
    for name, method, path, headers, body in CASES:
        got = _comparable(_send(lanes, method, path, headers, body))
        expected = _comparable(_send(routed, method, path, headers, body))
        assert got == expected, name
    assert _requests_total(lanes) == _requests_total(routed)


def test_an_unhandled_error_on_a_lane_is_answered_as_routing_answers_it(
    clients: Callable[[bool], TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def fail(*_: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(chat_routes, "read_body", fail)
    lanes, routed = clients(True), clients(False)
    got = _send(lanes, "POST", "/v1/chat/completions", {}, CHAT)
    assert got.status_code == 500 and len(got.headers["x-request-id"]) == 32
    assert _comparable(got) == _comparable(_send(routed, "POST", "/v1/chat/completions", {}, CHAT))
