"""Fixtures of the SDK tests: a real Talaria proxy on a loopback port (simulated runtime at
500×, SQLite in a temporary directory), its admin API, and servers that are not Talaria."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from bench.harness.processes import free_port
from talaria.proxy.contract.settings import ProxySettings
from tests.integration.server import RunningProxy, running_proxy
from tests.sdk.support import ADMIN, Admin, FakeServer, Seen, fake_openai_app, serve

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before anything imports it


@pytest.fixture(scope="session")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("sdk-proxy")
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp}/proxy.db", admin_token=ADMIN, time_scale=500.0
    )
    with running_proxy(settings) as running:
        yield running


@pytest.fixture(scope="session")
def admin(proxy: RunningProxy) -> Admin:
    """GET an admin path of the proxy, as JSON (fails the test on an error status)."""

    def get(path: str) -> dict[str, Any]:
        data: dict[str, Any] = proxy.admin(path)
        return data

    return get


@pytest.fixture
def foreign() -> Iterator[FakeServer]:
    """An OpenAI-compatible server that is not Talaria."""
    seen = Seen()
    with serve(fake_openai_app(seen)) as url:
        yield FakeServer(url, seen)


@pytest.fixture
def broken_talaria() -> Iterator[FakeServer]:
    """Looks like Talaria in its replies, but its session endpoints fail."""
    seen = Seen()
    with serve(fake_openai_app(seen, talaria_like=True)) as url:
        yield FakeServer(url, seen)


@pytest.fixture
def closed_port_url() -> str:
    """A loopback base URL where nothing listens (connections are refused at once)."""
    return f"http://127.0.0.1:{free_port()}/v1"
