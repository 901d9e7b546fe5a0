"""An exception no handler answers still gets an answer with its ``x-request-id``, in the
envelope of the API it addressed: a 500 (logged), or a 400 for a RecursionError (input nested
deeper than a parser follows)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.dialects.anthropic import routes as anthropic_routes
from talaria.proxy.edge.app import create_app
from talaria.runtime.instant import InstantRuntime


@pytest.mark.parametrize(
    ("path", "raised", "status"),
    [
        ("/boom", RuntimeError("bug"), 500),
        ("/v1/messages", RuntimeError("bug"), 500),
        ("/boom", RecursionError("deep"), 400),
    ],
)
def test_an_unhandled_exception_is_answered_with_its_request_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str, raised: Exception, status: int
) -> None:
    """A route of the proxy's own (``/boom``, added here) answers in OpenAI's envelope; the
    Messages route, whose body reader is made to fail, in Anthropic's."""
    app = create_app(
        ProxySettings(database_url=f"sqlite+aiosqlite:///{tmp_path}/e.db"),
        runtimes=[InstantRuntime(("m",))],
    )

    async def fail() -> None:
        raise raised

    async def fail_reading(*_: object) -> None:
        raise raised

    if path == "/boom":
        app.post(path)(fail)
    else:
        monkeypatch.setattr(anthropic_routes, "read_body", fail_reading)
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.post(path, json={})
    assert response.status_code == status
    assert len(response.headers["x-request-id"]) == 32
    body = response.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "api_error"
    else:
        assert set(body["error"]) >= {"message", "type"}
