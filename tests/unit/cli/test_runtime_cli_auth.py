"""The runtime token at the command line: ``talaria runtime`` refuses a non-loopback ``--host``
without ``TALARIA_RUNTIME_TOKEN`` (as ``talaria serve`` refuses one without API keys), the app
it starts checks the token, and ``talaria serve --model`` gives its runtime child a token and
sends it; the proxy's setting never shows the token."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr, ValidationError
from typer.testing import CliRunner

from talaria.cli import app
from talaria.proxy.contract.settings import ProxySettings
from talaria.runtime import serve
from tests.support import flat

runner = CliRunner()
TOKEN = "a-runtime-token-of-32-characters"
NODE_TOML = '[node]\nname = "n0"\n\n[[model]]\nname = "glm-4.5-fp8"\nengine = "sim"\n'


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    """``talaria runtime`` up to the point where it would listen: each start's app and host."""
    monkeypatch.delenv("TALARIA_RUNTIME_TOKEN", raising=False)
    monkeypatch.delenv("TALARIA_RUNTIME_MODELS_DIR", raising=False)
    (tmp_path / "node.toml").write_text(NODE_TOML)
    seen: list[dict[str, Any]] = []

    def serve_runtime(app_: FastAPI, host: str, *args: object) -> None:
        seen.append({"app": app_, "host": host})

    monkeypatch.setattr(serve, "serve_runtime", serve_runtime)
    return seen


def _status_of(app_: FastAPI, token: str | None = None) -> int:
    """The status code of ``GET /v1/runtime/status`` (the token is checked before the app's
    lifespan would be needed)."""

    async def get() -> int:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        transport = httpx.ASGITransport(app_, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://rt") as client:
            return (await client.get("/v1/runtime/status", headers=headers)).status_code

    return asyncio.run(get())


def test_a_non_loopback_runtime_needs_a_token(
    started: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ["runtime", "--config", str(tmp_path / "node.toml")]
    for host in ("0.0.0.0", "192.0.2.10", "::"):
        refused = runner.invoke(app, [*config, "--host", host])
        assert refused.exit_code == 2, refused.output
        text = flat(refused.output)
        assert "Invalid value for '--host': no TALARIA_RUNTIME_TOKEN:" in text
        assert "set TALARIA_RUNTIME_TOKEN (at least 16 characters" in text
        assert "Traceback" not in refused.output
    assert started == []
    # loopback stays open, as the tests, benches and the e2e harness use it
    for host in ("127.0.0.1", "::1", "localhost"):
        assert runner.invoke(app, [*config, "--host", host]).exit_code == 0, host
    assert [_status_of(s["app"]) for s in started] == [500] * 3  # past the token check
    started.clear()
    monkeypatch.setenv("TALARIA_RUNTIME_TOKEN", f"  {TOKEN}\n")  # a Secret file's newline
    opened = runner.invoke(app, [*config, "--host", "0.0.0.0"])
    assert opened.exit_code == 0, opened.output
    [start] = started
    assert start["host"] == "0.0.0.0"
    assert _status_of(start["app"]) == 401
    assert _status_of(start["app"], "x" * 32) == 401
    assert _status_of(start["app"], TOKEN) == 500  # past the token check
    assert TOKEN not in opened.output


def test_a_short_runtime_token_is_refused_without_echoing_it(
    started: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TALARIA_RUNTIME_TOKEN", "tok")
    refused = runner.invoke(app, ["runtime", "--config", str(tmp_path / "node.toml")])
    assert refused.exit_code == 2 and started == []
    text = flat(refused.output)
    assert "TALARIA_RUNTIME_TOKEN must be at least 16 characters (it has 3)" in text
    assert "'tok'" not in text
    with pytest.raises(ValidationError, match="at least 16 characters") as invalid:
        ProxySettings(runtime_token="tok")
    assert "'tok'" not in str(invalid.value)


def test_the_models_dir_must_exist(started: list[dict[str, Any]], tmp_path: Path) -> None:
    config = ["runtime", "--config", str(tmp_path / "node.toml")]
    absent = runner.invoke(app, [*config, "--models-dir", str(tmp_path / "absent")])
    assert absent.exit_code == 2 and started == []
    assert "'--models-dir'" in flat(absent.output)


def test_the_proxy_setting_is_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TALARIA_RUNTIME_TOKEN", TOKEN + "\n")
    settings = ProxySettings()
    assert settings.runtime_token is not None
    assert settings.runtime_token.get_secret_value() == TOKEN
    assert TOKEN not in repr(settings) and TOKEN not in str(settings)
    monkeypatch.setenv("TALARIA_RUNTIME_TOKEN", "")
    assert ProxySettings().runtime_token is None


@pytest.mark.parametrize("operators", [None, "the-operators-own-token-0123456789"])
def test_serve_model_gives_its_runtime_child_a_token(
    monkeypatch: pytest.MonkeyPatch, operators: str | None
) -> None:
    from talaria.cli import serve as serve_cli
    from talaria.cli import supervised

    children: list[str | None] = []
    served: list[ProxySettings] = []

    class Child:
        url = "http://127.0.0.1:9"

    @contextmanager
    def child_runtime(
        args: list[str], drain_s: float, ready_s: float, token: str | None = None
    ) -> Iterator[Child]:
        children.append(token)
        yield Child()

    monkeypatch.setattr(supervised, "supervised_runtime", child_runtime)
    monkeypatch.setattr(serve_cli, "_serve", lambda settings, *args: served.append(settings))
    settings = ProxySettings(runtime_token=SecretStr(operators) if operators else None)
    serve_cli._serve_over_child(settings, ["--model", "m"], "127.0.0.1", 8000, "info")
    [token] = children
    assert token is not None and len(token) >= 32
    if operators:
        assert token == operators
    [proxy] = served
    assert proxy.runtimes == [Child.url]
    assert proxy.runtime_token is not None and proxy.runtime_token.get_secret_value() == token
