"""The cap on a tenant's live sessions through the real HTTP stack: past
``TALARIA_MAX_SESSIONS_PER_TENANT`` a call that would open a session gets 429
``too_many_sessions`` with Retry-After, in each API's envelope; continuations of live sessions
get 200; ending a session makes room."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from talaria.proxy.contract.settings import ProxySettings
from tests.integration.server import running_proxy

MODEL = "glm-4.5-fp8"
IDLE_S = 600.0


def _chat(http: httpx.Client, messages: list[dict[str, Any]], **headers: str) -> httpx.Response:
    body = {"model": MODEL, "messages": messages, "max_tokens": 16}
    return http.post("/v1/chat/completions", json=body, headers=headers)


def _retry_after(reply: httpx.Response) -> int:
    """Until the least recently used session may idle out: about the idle timeout here."""
    value = int(reply.headers["retry-after"])
    assert IDLE_S - 60 < value <= IDLE_S
    return value


def test_past_the_cap_new_sessions_get_429_and_continuations_200(tmp_path: Path) -> None:
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path}/s.db",
        models=[MODEL],
        time_scale=200.0,
        session_idle_timeout_s=IDLE_S,
        max_sessions_per_tenant=2,
    )
    with (
        running_proxy(settings) as proxy,
        httpx.Client(base_url=proxy.base_url, timeout=30) as http,
    ):
        task = [{"role": "user", "content": "task one"}]
        first = _chat(http, task)  # an implicit session
        named = _chat(
            http, [{"role": "user", "content": "task two"}], **{"X-Talaria-Session-Id": "n-1"}
        )
        assert (first.status_code, named.status_code) == (200, 200)

        refused = _chat(http, [{"role": "user", "content": "task three"}])
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert (error["code"], error["type"]) == ("too_many_sessions", "rate_limit_error")
        _retry_after(refused)
        other_id = _chat(http, task, **{"X-Talaria-Session-Id": "n-2"})  # a new named one
        assert other_id.status_code == 429

        reply = first.json()["choices"][0]["message"]
        again = _chat(http, [*task, reply, {"role": "user", "content": "go on"}])
        assert again.status_code == 200, again.text
        key = "x-talaria-session-key"
        assert again.headers[key] == first.headers[key]  # the same session
        goes_on = _chat(
            http, [{"role": "user", "content": "task two"}], **{"X-Talaria-Session-Id": "n-1"}
        )
        assert goes_on.status_code == 200  # a retry of the named session's prompt

        messages = http.post(
            "/v1/messages",
            json={"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "x"}]},
        )
        assert messages.status_code == 429
        assert messages.json() == {
            "type": "error",
            "error": {"type": "rate_limit_error", "message": error["message"]},
        }
        _retry_after(messages)
        responses = http.post("/v1/responses", json={"model": MODEL, "input": "y"})
        assert responses.status_code == 429
        assert responses.json()["error"]["code"] == "too_many_sessions"

        assert http.post("/v1/sessions/n-1/end").status_code == 200
        assert _chat(http, [{"role": "user", "content": "task three"}]).status_code == 200
