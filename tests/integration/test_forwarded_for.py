"""Whose address a request counts against (issue 46, Low: ``X-Forwarded-For`` from a loopback
peer picked the sign-in throttle's address), through the server ``talaria serve`` runs
(core/http_edge.py's ``BoundedConfig``: uvicorn, the bounded protocol) on a loopback port:

- with no trusted proxy (the default), a client that rotates ``X-Forwarded-For`` is still
  throttled as its connection's peer after five failed sign-ins;
- behind a trusted proxy (``trusted_proxies``), the throttle counts the right-most address
  that is not a trusted proxy: rotating the client-written left-most entries changes nothing,
  and another relayed client has its own count;
- in open mode (no API key) a loopback peer that relays someone else's request is not a local
  caller, and one that names no one is.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from talaria.core.http_edge import BoundedConfig, EdgeBounds
from talaria.proxy.console.throttle import MAX_FAILURES
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.edge.app import create_app
from talaria.runtime.instant import InstantRuntime
from tests.integration.server import DrainingTestServer

ADMIN = "admin-secret-token"
MODEL = "m"


@contextmanager
def served(tmp_path: Path, **settings: Any) -> Iterator[str]:
    """The proxy as ``talaria serve`` serves it (its uvicorn config), on a loopback port."""
    cfg = ProxySettings(database_url=f"sqlite+aiosqlite:///{tmp_path}/p.db", **settings)
    app = create_app(cfg, runtimes=[InstantRuntime((MODEL,), output_tokens=1)])
    config = BoundedConfig(
        app, EdgeBounds(), host="127.0.0.1", port=0, log_level="warning", lifespan="on"
    )
    server = DrainingTestServer(config, app)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    assert server.ready.wait(timeout=60), "the proxy did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.begin_drain()
        server.should_exit = True
        thread.join(timeout=60)


def _sign_in(http: httpx.Client, forwarded_for: str) -> int:
    reply = http.post(
        "/console/login", data={"token": "a guess"}, headers={"x-forwarded-for": forwarded_for}
    )
    return reply.status_code


def test_a_loopback_client_cannot_escape_the_throttle_by_rotating_x_forwarded_for(
    tmp_path: Path,
) -> None:
    """Before the fix uvicorn took a loopback peer's ``X-Forwarded-For`` as the client: each
    guess from a new made-up address was a first failure, never 429."""
    with served(tmp_path, admin_token=ADMIN) as url, httpx.Client(base_url=url) as http:
        codes = [_sign_in(http, f"198.51.100.{i}") for i in range(MAX_FAILURES + 2)]
    assert codes == [401] * MAX_FAILURES + [429, 429]


def test_behind_a_trusted_proxy_the_right_most_untrusted_hop_is_counted(tmp_path: Path) -> None:
    """The loopback peer is a trusted proxy that appended its client, 203.0.113.7; what that
    client wrote to the left of it changes from guess to guess and does not matter."""
    with (
        served(tmp_path, admin_token=ADMIN, trusted_proxies="127.0.0.1, 10.0.0.0/8") as url,
        httpx.Client(base_url=url) as http,
    ):
        codes = [
            _sign_in(http, f"192.0.2.{i}, 203.0.113.7, 10.1.2.3") for i in range(MAX_FAILURES + 1)
        ]
        assert codes == [401] * MAX_FAILURES + [429]
        assert _sign_in(http, "203.0.113.8") == 401  # another client: its own count
        assert _sign_in(http, "192.0.2.1, 203.0.113.7") == 429


def test_open_mode_serves_a_loopback_caller_but_not_one_relayed_for_someone(
    tmp_path: Path,
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    with served(tmp_path) as url, httpx.Client(base_url=url, timeout=30) as http:
        assert http.post("/v1/chat/completions", json=body).status_code == 200
        relayed = http.post(
            "/v1/chat/completions", json=body, headers={"x-forwarded-for": "127.0.0.1"}
        )
        assert relayed.status_code == 401
        assert "only local callers" in relayed.json()["error"]["message"]
