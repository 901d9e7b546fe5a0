"""A client's session id may hold ``/`` (issue 23, finding 6.2): it can be hinted and ended
over REST, and read and ended on the admin API, sent as is or percent-encoded (``%2F``, what
the SDK and the console send), with the real openai, httpx and SDK clients. Before, the route
did not match (404 ``Not Found``) and such a session could only be ended by its final call."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import openai
import pytest

from talaria.proxy.contract.settings import ProxySettings
from talaria.runtime.instant import InstantRuntime
from talaria.sdk import OpenAI, session
from tests.integration.server import RunningProxy, running_proxy

ADMIN = {"Authorization": "Bearer admin-secret-token"}
MODEL = "m"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    tmp: Path = tmp_path_factory.mktemp("session-paths")
    cfg = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp}/s.db", admin_token=ADMIN["Authorization"][7:]
    )
    with running_proxy(cfg, runtimes=[InstantRuntime((MODEL,), output_tokens=2)]) as running:
        yield running


def _call(client: openai.OpenAI, sid: str) -> None:
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"X-Talaria-Session-Id": sid},
    )


def _admin(proxy: RunningProxy, sid: str) -> dict[str, Any]:
    doc: dict[str, Any] = proxy.admin(f"/admin/sessions/{quote(sid, safe='')}")
    return doc


@pytest.mark.parametrize("sid", ["team/task-1", "a/b/end", "/leading/and/trailing/"])
def test_a_session_id_with_slashes_is_hinted_and_ended_with_the_openai_client(
    proxy: RunningProxy, sid: str
) -> None:
    client = openai.OpenAI(base_url=proxy.v1, api_key="local", max_retries=0)
    _call(client, sid)
    encoded = quote(sid, safe="")
    hinted = client.post(f"/sessions/{encoded}/hints", body={"expected_s": 3}, cast_to=object)
    assert hinted == {"session_id": sid, "accepted": True}
    assert _admin(proxy, sid)["session"]["session_id"] == sid
    ended = client.post(f"/sessions/{encoded}/end", cast_to=object)
    assert ended == {"session_id": sid, "ended": True}
    assert _admin(proxy, sid)["session"]["state"] == "ended"


def test_a_session_id_with_a_slash_sent_unencoded_with_httpx(proxy: RunningProxy) -> None:
    client = openai.OpenAI(base_url=proxy.v1, api_key="local", max_retries=0)
    _call(client, "raw/slash")
    with httpx.Client(base_url=proxy.base_url, timeout=30) as http:
        hint = http.post("/v1/sessions/raw/slash/hints", json={"expected_ms": 1500})
        assert hint.status_code == 200 and hint.json()["session_id"] == "raw/slash"
        end = http.post("/v1/sessions/raw/slash/end")
        assert end.json() == {"session_id": "raw/slash", "ended": True}


def test_the_admin_api_reads_and_ends_a_session_id_with_a_slash(proxy: RunningProxy) -> None:
    client = openai.OpenAI(base_url=proxy.v1, api_key="local", max_retries=0)
    _call(client, "ops/job-9")
    assert _admin(proxy, "ops/job-9")["session"]["state"] != "ended"
    end = httpx.post(f"{proxy.base_url}/admin/sessions/ops%2Fjob-9/end", headers=ADMIN)
    assert end.status_code == 200 and end.json()["ended"] is True, end.text
    assert _admin(proxy, "ops/job-9")["session"]["end_reason"] == "admin"


def test_the_sdk_ends_its_session_with_a_slash_on_exit(proxy: RunningProxy) -> None:
    client = OpenAI(base_url=proxy.v1, api_key="local", max_retries=0)
    with session("org/agent-7"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    detail = _admin(proxy, "org/agent-7")["session"]
    assert (detail["state"], detail["end_reason"]) == ("ended", "client")
