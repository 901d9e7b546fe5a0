"""A private runtime (runtime/auth.py): with a token, every route of the runtime's app but the
two probes answers 401 without it, over a real socket; the proxy's client (``HttpRuntime``)
sends it on every request and fails its start at once on a 401; hints refuse non-finite
gaps."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from talaria.core.protocol_calls import request_to_dict
from talaria.core.types import CallRequest
from talaria.proxy.runtimes.http import HttpRuntime, RuntimeTokenRefused
from talaria.runtime import placement_routes
from talaria.runtime.config import load_node_config
from talaria.runtime.server import create_runtime_app
from tests.integration.server import StatusLog, running_app

TOKEN = "runtime-token-0123456789abcdef"
NODE_TOML = """
[node]
name = "rt-private"
quantum_s = 30
time_scale = 500

[[model]]
name = "glm-4.5-fp8"
engine = "sim"
"""
PROBES = {("GET", "/healthz"), ("GET", "/readyz")}


def _app(tmp_path: Path, token: str | None = TOKEN) -> FastAPI:
    path = tmp_path / "node.toml"
    path.write_text(NODE_TOML)
    return create_runtime_app(load_node_config(path), token=token)


def _requests(routes: Sequence[BaseRoute], prefix: str = "") -> list[tuple[str, str]]:
    """(method, path) of every route in ``routes`` (an app's), path parameters filled in,
    routers included with ``include_router`` walked into (FastAPI keeps them as one entry
    holding the router and its prefix)."""
    out = []
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            out += _requests(included.routes, prefix + route.include_context.prefix)  # type: ignore[attr-defined]
            continue
        assert isinstance(route, Route), route
        path = prefix + re.sub(r"\{[^}]+\}", "x", route.path)
        out += [(method, path) for method in sorted(route.methods or ()) if method != "HEAD"]
    return out


@pytest.fixture
def private(tmp_path: Path) -> Iterator[tuple[FastAPI, str]]:
    app = _app(tmp_path)
    with running_app(app) as url:
        yield app, url


def test_every_route_but_the_probes_needs_the_token(private: tuple[FastAPI, str]) -> None:
    app, url = private
    requests = _requests(app.routes)
    assert set(requests) >= PROBES
    guarded = [r for r in requests if r not in PROBES]
    # the routes today; any route added later is enumerated the same way
    assert {
        ("GET", "/v1/runtime/status"),
        ("POST", "/v1/runtime/generate"),
        ("POST", "/v1/runtime/sessions/x/x"),  # hint, end, moved (a key may hold "/")
        ("POST", "/v1/runtime/ends"),
        ("POST", "/v1/runtime/models"),
        ("POST", "/v1/runtime/models/x/drain"),
        ("DELETE", "/v1/runtime/models/x"),
        ("GET", "/v1/runtime/demand"),
    } <= set(guarded)
    wrong = {"authorization": "Bearer " + TOKEN[:-1] + "X"}
    for headers in ({}, wrong, {"authorization": TOKEN}, {"authorization": "Basic " + TOKEN}):
        for method, path in guarded:
            answer = httpx.request(method, url + path, json={}, headers=headers)
            assert answer.status_code == 401, (method, path, headers, answer.text)
            assert answer.headers["www-authenticate"] == "Bearer"
            assert set(answer.json()) == {"error"}
            assert TOKEN not in answer.text
    assert "needs Authorization: Bearer" in httpx.get(url + "/v1/runtime/status").json()["error"]
    # an unknown path says nothing of what exists without the token
    assert httpx.get(url + "/v1/runtime/nothing-here").status_code == 401
    good = {"authorization": f"Bearer {TOKEN}"}
    for method, path in guarded:  # served: whatever the route answers to {} or x, not 401
        answer = httpx.request(method, url + path, json={}, headers=good)
        assert answer.status_code != 401, (method, path, answer.text)
    # the scheme is case-insensitive, as RFC 9110 says
    lower = {"authorization": f"bearer {TOKEN}"}
    assert httpx.get(url + "/v1/runtime/status", headers=lower).status_code == 200
    for method, path in PROBES:
        assert httpx.request(method, url + path).status_code == 200, path


def test_normal_answers_with_the_token(private: tuple[FastAPI, str]) -> None:
    _, url = private
    client = httpx.Client(base_url=url, headers={"authorization": f"Bearer {TOKEN}"})
    with client:
        assert client.get("/v1/runtime/status").json()["instance"] == "rt-private"
        assert client.get("/v1/runtime/demand").status_code == 200
        call = request_to_dict(CallRequest("r1", "s1", "glm-4.5-fp8", 100, 4))
        generated = client.post("/v1/runtime/generate", json=call)
        assert generated.status_code == 200 and '"finished"' in generated.text
        for action, body in (("hint", {"expected_gap_s": 5}), ("moved", {}), ("end", {})):
            assert client.post(f"/v1/runtime/sessions/s1/{action}", json=body).json() == {
                "ok": True
            }


def test_a_route_added_later_is_covered(tmp_path: Path) -> None:
    app = _app(tmp_path)

    @app.get("/v1/runtime/later")
    async def later() -> JSONResponse:
        return JSONResponse({"secret": "everything"})

    with running_app(app) as url:
        assert httpx.get(url + "/v1/runtime/later").status_code == 401
        authorized = {"authorization": f"Bearer {TOKEN}"}
        assert httpx.get(url + "/v1/runtime/later", headers=authorized).status_code == 200


def test_without_a_token_the_runtime_is_open(tmp_path: Path) -> None:
    """Loopback use (tests, benches, the e2e harness): no token, nothing checked."""
    app = _app(tmp_path, token=None)
    with running_app(app) as url:
        assert httpx.get(url + "/v1/runtime/status").status_code == 200
        wrong = {"authorization": "Bearer whatever"}
        assert httpx.get(url + "/v1/runtime/status", headers=wrong).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        '{"expected_gap_s": NaN}',
        '{"expected_gap_s": Infinity}',
        '{"expected_gap_s": -Infinity}',
        '{"expected_gap_s": 1e400}',  # a float literal past the range: inf
        '{"expected_gap_s": ' + "9" * 400 + "}",  # an integer past float's range
        '{"expected_gap_s": -1}',
        '{"expected_gap_s": true}',
        '{"expected_gap_s": "5"}',
        '{"expected_gap_s": null}',
        "[5]",
        "{not json",
    ],
)
def test_a_hint_must_be_a_finite_non_negative_number(
    private: tuple[FastAPI, str], body: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, url = private
    hints: list[tuple[str, float]] = []
    monkeypatch.setattr(app.state.runtime.node, "hint", lambda key, s: hints.append((key, s)))
    headers = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    hint = url + "/v1/runtime/sessions/s1/hint"
    answer = httpx.post(hint, content=body, headers=headers)
    assert answer.status_code == 400, answer.text
    assert "finite, non-negative" in answer.json()["error"]
    assert hints == []  # nothing reached the reservation
    accepted = httpx.post(hint, json={"expected_gap_s": 7.5}, headers=headers)
    assert accepted.status_code == 200 and hints == [("s1", 7.5)]


def test_the_proxys_client_sends_the_token_on_every_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(placement_routes, "LEAVE_GRACE_S", 0.0)
    log = StatusLog(_app(tmp_path))

    async def every_request(url: str) -> None:
        runtime = HttpRuntime(url, status_ttl_s=0, token=TOKEN)
        try:
            await runtime.start()
            request = CallRequest("r1", "s1", "glm-4.5-fp8", 200, 4)
            events = [event async for event in runtime.generate(request)]
            assert events
            await runtime.status()
            await runtime.demand(60.0)
            await runtime.add_model({"name": "gpt-oss-120b", "engine": "sim"})
            await runtime.drain_model("gpt-oss-120b")
            await runtime.remove_model("gpt-oss-120b")
            await runtime.hint("s1", 3.0)
            await runtime.session_moved("s1")
            await runtime.end_sessions(["s1"])
        finally:
            await runtime.close()

    with running_app(log) as url:
        asyncio.run(every_request(url))
    paths = {path for _, path, _ in log.seen}
    assert {
        "/v1/runtime/status",
        "/v1/runtime/generate",
        "/v1/runtime/demand",
        "/v1/runtime/models",
        "/v1/runtime/models/gpt-oss-120b/drain",
        "/v1/runtime/models/gpt-oss-120b",
        "/v1/runtime/sessions/s1/hint",
        "/v1/runtime/sessions/s1/moved",
        "/v1/runtime/ends",
    } <= paths
    assert [seen for seen in log.seen if seen[2] >= 400] == []


@pytest.mark.parametrize(("token", "sent"), [(None, "no token"), ("x" * 32, "does not accept")])
def test_a_refused_token_fails_the_clients_start_at_once(
    private: tuple[FastAPI, str], token: str | None, sent: str
) -> None:
    _, url = private

    async def start() -> None:
        runtime = HttpRuntime(url, token=token)
        try:
            await runtime.start(attempts=100)  # a retry loop would take minutes
        finally:
            await runtime.close()

    with pytest.raises(RuntimeTokenRefused) as refused:
        asyncio.run(asyncio.wait_for(start(), timeout=30))
    message = str(refused.value)
    assert f"runtime {url} refused the runtime token (TALARIA_RUNTIME_TOKEN)" in message
    assert sent in message and "x" * 32 not in message


def test_the_token_never_reaches_a_log_line_or_an_error(
    private: tuple[FastAPI, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A runtime's error answer (raise_for_status) carries the request's headers in its
    ``repr``: the client describes it without them."""
    _, url = private

    async def refused_requests() -> list[str]:
        runtime = HttpRuntime(url, token=TOKEN)
        errors = []
        try:
            await runtime.hint("s1", -1.0)  # a 400, logged (best effort)
            for bad in (runtime.demand(0.0), runtime.add_model({"engine": "sim"})):
                try:
                    await bad
                except Exception as exc:  # RuntimeUnavailable, PlacementRefused
                    errors.append(str(exc))
        finally:
            await runtime.close()
        return errors

    with caplog.at_level("WARNING", logger="talaria.proxy.runtimes.http"):
        errors = asyncio.run(refused_requests())
    assert "/v1/runtime/sessions/s1/hint failed" in caplog.text
    assert len(errors) == 2 and all("400" in e or "name" in e for e in errors), errors
    assert TOKEN not in caplog.text and all(TOKEN not in e for e in errors)
