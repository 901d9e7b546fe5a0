"""The internal headers of Talaria's replicas (proxy/cluster/trust.py) from a client, on a lone
proxy, through the real HTTP stack: the attack of issue 23 (finding 2) reproduced.

Tenant B learns tenant A's request id (an ``x-request-id``, or the id in A's response ids) and
sends its own call with ``x-talaria-forwarded-by`` and ``x-talaria-request-id: <A's id>``.
Before, the proxy took the id as a peer's: B's call was recorded under A's id, replacing A's
stored Responses-API response (A's GET went 200 → 404, B's 404 → 200) and moving A's call
record into B's session. Now any such header from a client is a 400 in the API's envelope,
before anything runs, and A's records stay A's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.store.db import make_engine, make_sessionmaker
from talaria.proxy.store.migrate import upgrade_async
from talaria.proxy.store.repository import SqlStore
from tests.integration.server import running_proxy

ADMIN = "internal-headers-admin"
MODEL = "glm-4.5-fp8"
FORGED = [
    {"x-talaria-forwarded-by": "http://10.0.0.9:8000"},
    {"x-talaria-request-id": "{rid}"},
    {"x-talaria-forwarded-by": "http://10.0.0.9:8000", "x-talaria-request-id": "{rid}"},
    {  # a made-up signature changes nothing: a lone proxy has no peers
        "x-talaria-forwarded-by": "http://10.0.0.9:8000",
        "x-talaria-request-id": "{rid}",
        "x-talaria-timestamp": "1767225600",
        "x-talaria-body-sha256": "0" * 64,
        "x-talaria-signature": "0" * 64,
    },
]
ROUTES = {  # path → a call's body
    "/v1/responses": {"model": MODEL, "input": "Summarise the plan."},
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Summarise the plan."}],
    },
    "/v1/messages": {
        "model": MODEL,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "Summarise the plan."}],
    },
}


@dataclass
class Proxy:
    base_url: str
    tenants: dict[str, tuple[str, str]]
    """"a" and "b" → (tenant id, API key)."""


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    """A lone proxy with two tenants, A and B, each with its key."""
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('internal') / 'i.db'}"

    async def tenants() -> dict[str, tuple[str, str]]:
        await upgrade_async(url)
        engine = make_engine(url)
        store = SqlStore(make_sessionmaker(engine))
        made = {}
        try:
            for name in ("a", "b"):
                tenant = await store.tenants.create_tenant(f"tenant-{name}")
                made[name] = (tenant, await store.tenants.create_api_key(tenant))
        finally:
            await engine.dispose()
        return made

    made = asyncio.run(tenants())
    settings = ProxySettings(database_url=url, admin_token=ADMIN, models=[MODEL], time_scale=200.0)
    with running_proxy(settings) as running:
        yield Proxy(running.base_url, made)


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}


def _forged(headers: dict[str, str], rid: str) -> dict[str, str]:
    return {name: value.format(rid=rid) for name, value in headers.items()}


def _refused(response: httpx.Response, path: str) -> None:
    assert response.status_code == 400, response.text
    doc: dict[str, Any] = response.json()
    if path.startswith("/v1/messages"):  # Anthropic's envelope
        assert doc["type"] == "error"
        assert doc["error"]["type"] == "invalid_request_error"
        message = doc["error"]["message"]
    else:
        assert doc["error"]["code"] == "internal_header"
        message = doc["error"]["message"]
    assert "is internal to Talaria's replicas" in message
    assert response.headers["x-request-id"]


@pytest.mark.parametrize("forged", FORGED, ids=["by", "id", "by+id", "signed"])
def test_b_posing_as_a_replica_with_as_request_id_cannot_take_as_response(
    proxy: Proxy, forged: dict[str, str]
) -> None:
    (_, key_a), (_, key_b) = proxy.tenants["a"], proxy.tenants["b"]
    with httpx.Client(base_url=proxy.base_url, timeout=30) as http:
        mine = http.post("/v1/responses", json=ROUTES["/v1/responses"], headers=_auth(key_a))
        assert mine.status_code == 200, mine.text
        response_id = mine.json()["id"]
        rid = mine.headers["x-request-id"]
        assert rid in response_id  # what B needs is in any id A shows

        theirs = http.post(
            "/v1/responses",
            json=ROUTES["/v1/responses"],
            headers={**_auth(key_b), **_forged(forged, rid)},
        )
        _refused(theirs, "/v1/responses")

        a_reads = http.get(f"/v1/responses/{response_id}", headers=_auth(key_a))
        assert a_reads.status_code == 200 and a_reads.json()["id"] == response_id
        b_reads = http.get(f"/v1/responses/{response_id}", headers=_auth(key_b))
        assert b_reads.status_code == 404


@pytest.mark.parametrize("path", sorted(ROUTES))
@pytest.mark.parametrize("forged", FORGED, ids=["by", "id", "by+id", "signed"])
def test_b_posing_as_a_replica_is_refused_and_as_call_stays_in_as_session(
    proxy: Proxy, path: str, forged: dict[str, str]
) -> None:
    (a, key_a), (b, key_b) = proxy.tenants["a"], proxy.tenants["b"]
    admin = {"authorization": f"Bearer {ADMIN}"}
    with httpx.Client(base_url=proxy.base_url, timeout=30) as http:
        mine = http.post(path, json=ROUTES[path], headers=_auth(key_a))
        assert mine.status_code == 200, mine.text
        rid, session = mine.headers["x-request-id"], mine.headers["x-talaria-session-key"]

        theirs = http.post(
            path, json=ROUTES[path], headers={**_auth(key_b), **_forged(forged, rid)}
        )
        _refused(theirs, path)

        timeline = http.get(f"/admin/sessions/{session}", headers=admin).json()
        assert timeline["session"]["tenant_id"] == a
        assert rid in [c["request_id"] for c in timeline["calls"]]
        b_sessions = http.get(f"/admin/sessions?tenant={b}", headers=admin).json()["data"]
        assert b_sessions == []  # refused before anything ran


def test_internal_headers_on_every_route_are_refused(proxy: Proxy) -> None:
    """Hints, ends, reads and admin routes too: a lone proxy has no peer to hear from."""
    forged = {"x-talaria-forwarded-by": "http://10.0.0.9:8000"}
    key_a = proxy.tenants["a"][1]
    with httpx.Client(base_url=proxy.base_url, timeout=30, headers=_auth(key_a)) as http:
        for method, path in [
            ("POST", "/v1/sessions/any/hints"),
            ("POST", "/v1/sessions/any/end"),
            ("GET", "/v1/models"),
            ("GET", "/v1/responses/resp_x"),
            ("POST", "/admin/sessions/any/end"),
        ]:
            response = http.request(method, path, json={"expected_s": 1}, headers=forged)
            _refused(response, path)


def test_a_client_without_internal_headers_is_served(tmp_path: Path) -> None:
    """The header check passes ordinary requests (other x-talaria-* headers included)."""
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'o.db'}", models=[MODEL], time_scale=200.0
    )
    with running_proxy(settings) as running, httpx.Client(base_url=running.base_url) as http:
        response = http.post(
            "/v1/chat/completions",
            json=ROUTES["/v1/chat/completions"],
            headers={"x-talaria-session-id": "mine", "x-talaria-tool-gap-ms": "500"},
        )
        assert response.status_code == 200, response.text
