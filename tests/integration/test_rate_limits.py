"""API keys' rate limits through the real HTTP stack (uvicorn on a loopback port, a real SQLite
file, a runtime that answers at once, a fixed wall clock): a key past its calls or tokens per
minute gets 429 ``rate_limit_exceeded`` with ``Retry-After`` until its minute ends, in each
API's envelope, and nothing runs; other keys (another tenant's, the same tenant's unlimited
one) are served; a key without limits never is refused; a new minute serves the key again. Two
proxies (two replicas) on one database share a key's counts once they sync, on SQLite and on
PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from talaria.proxy.callpath.limiter import RateLimiter
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.edge.app import create_app
from talaria.proxy.store.db import make_engine, make_sessionmaker
from talaria.proxy.store.migrate import upgrade_async
from talaria.proxy.store.repository import SqlStore
from talaria.runtime.instant import InstantRuntime
from tests.integration.server import running_app
from tests.support import pg_url, reset_postgres

MODEL = "glm-4.5-fp8"
T0 = 1_800_000_000.0  # a whole UTC minute
ASK = "Summarise the plan."
ROUTES = {  # path → a call's body
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": ASK}]},
    "/v1/completions": {"model": MODEL, "prompt": ASK, "max_tokens": 8},
    "/v1/messages": {
        "model": MODEL,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": ASK}],
    },
    "/v1/responses": {"model": MODEL, "input": ASK, "store": False},
}
KEYS = {  # name → (tenant, rpm, tpm)
    "bursty": ("bursty", 2, None),
    "bursty-free": ("bursty", None, None),  # the same tenant, a key without limits
    "calm": ("calm", 10, None),  # another tenant, its own limit
    "tokens": ("tokens", None, 5),  # a call reserves more than 5: the whole minute's, alone
    "free": ("free", None, None),
    "later": ("later", 1, None),
}


@dataclass
class WallClock:
    """The proxy's wall clock: moved only by the tests."""

    now: float = T0 + 15.25

    def __call__(self) -> float:
        return self.now


@dataclass
class Proxy:
    base_url: str
    runtime: InstantRuntime
    clock: WallClock
    keys: dict[str, str]
    database_url: str


async def _make_keys(
    url: str, keys: dict[str, tuple[str, int | None, int | None]]
) -> dict[str, str]:
    await upgrade_async(url)
    engine = make_engine(url)
    tenants = SqlStore(make_sessionmaker(engine)).tenants
    try:
        made = {}
        for name, (tenant, rpm, tpm) in keys.items():
            tenant_id = await tenants.create_tenant(tenant)
            made[name] = await tenants.create_api_key(tenant_id, rpm=rpm, tpm=tpm)
        return made
    finally:
        await engine.dispose()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('limits') / 'l.db'}"
    keys = asyncio.run(_make_keys(url, KEYS))
    runtime = InstantRuntime((MODEL,), output_tokens=4)
    clock = WallClock()
    settings = ProxySettings(database_url=url, time_scale=4.0)
    app = create_app(settings, runtimes=[runtime], wall_clock=clock)
    with running_app(app) as base_url:
        yield Proxy(base_url, runtime, clock, keys, url)


def _post(proxy: Proxy, path: str, key: str, **extra: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}
    return httpx.post(proxy.base_url + path, json={**ROUTES[path], **extra}, headers=headers)


def _refused(reply: httpx.Response, path: str, named: str, retry_after: int) -> None:
    """A 429 in the route's envelope naming the limit ``named``, with ``Retry-After``."""
    assert reply.status_code == 429, reply.text
    assert reply.headers["retry-after"] == str(retry_after)
    doc: dict[str, Any] = reply.json()
    if path == "/v1/messages":  # Anthropic's envelope
        assert doc["type"] == "error" and doc["error"]["type"] == "rate_limit_error"
    else:  # OpenAI's
        assert doc["error"]["type"] == "rate_limit_error"
        assert doc["error"]["code"] == "rate_limit_exceeded"
    assert named in doc["error"]["message"]


def test_a_key_past_its_calls_per_minute_gets_429_in_each_apis_envelope(proxy: Proxy) -> None:
    key = proxy.keys["bursty"]
    for path in ("/v1/chat/completions", "/v1/messages"):
        assert _post(proxy, path, key).status_code == 200
    ran = proxy.runtime.calls
    for path in sorted(ROUTES):
        _refused(_post(proxy, path, key), path, "2 requests per minute", 45)
        _refused(_post(proxy, path, key, stream=True), path, "2 requests per minute", 45)
    assert proxy.runtime.calls == ran  # nothing ran
    for other in ("calm", "bursty-free", "free"):  # another tenant, an unlimited key
        for path in sorted(ROUTES):
            assert _post(proxy, path, proxy.keys[other]).status_code == 200, (other, path)


def test_a_key_past_its_tokens_per_minute_gets_429_in_each_apis_envelope(proxy: Proxy) -> None:
    key = proxy.keys["tokens"]
    served = _post(proxy, "/v1/chat/completions", key)
    assert served.status_code == 200
    assert served.json()["usage"]["total_tokens"] > 5  # charged what it used, not cut
    for path in sorted(ROUTES):
        _refused(_post(proxy, path, key), path, "5 tokens per minute", 45)


def test_a_key_without_limits_is_never_refused(proxy: Proxy) -> None:
    for n in range(12):
        path = sorted(ROUTES)[n % len(ROUTES)]
        assert _post(proxy, path, proxy.keys["free"]).status_code == 200


def test_a_new_minute_serves_the_key_again(proxy: Proxy) -> None:
    key = proxy.keys["later"]
    assert _post(proxy, "/v1/completions", key).status_code == 200
    proxy.clock.now = T0 + 59.5
    try:
        _refused(_post(proxy, "/v1/completions", key), "/v1/completions", "1 requests", 1)
        proxy.clock.now = T0 + 60.0
        assert _post(proxy, "/v1/completions", key).status_code == 200
        _refused(_post(proxy, "/v1/completions", key), "/v1/completions", "1 requests", 60)
    finally:
        proxy.clock.now = WallClock().now


def test_a_call_refused_before_it_runs_is_not_counted(proxy: Proxy) -> None:
    made = asyncio.run(_make_keys(proxy.database_url, {"careful": ("careful", 1, None)}))
    key = made["careful"]
    unknown = _post(proxy, "/v1/chat/completions", key, model="no-such-model")
    assert unknown.status_code == 404
    assert _post(proxy, "/v1/chat/completions", key).status_code == 200  # still its one call


# -- two replicas on one database --------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'shared.db'}"
    url = pg_url()
    asyncio.run(reset_postgres(url))
    return url


def test_two_replicas_share_a_keys_counts_through_the_store(shared_url: str) -> None:
    """Replica A serves two of the key's three calls a minute, B one (neither knows of the
    other's yet); once both synced, each refuses the key; another key is still served."""
    keys = asyncio.run(_make_keys(shared_url, {"k": ("acme", 3, None), "o": ("other", 3, None)}))
    clock = WallClock()
    # syncs only when the test says so: a day between the background ones
    settings = ProxySettings(database_url=shared_url, time_scale=4.0, rate_sync_s=86_400.0)

    async def main() -> None:
        apps = [
            create_app(
                settings, runtimes=[InstantRuntime((MODEL,), output_tokens=4)], wall_clock=clock
            )
            for _ in range(2)
        ]
        async with (
            apps[0].router.lifespan_context(apps[0]),
            apps[1].router.lifespan_context(apps[1]),
        ):
            clients = [
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r")
                for app in apps
            ]
            limiters = [app.state.talaria.limits for app in apps]
            assert all(isinstance(limiter, RateLimiter) for limiter in limiters)

            async def call(replica: int, key: str) -> int:
                headers = {"authorization": f"Bearer {keys[key]}"}
                body = ROUTES["/v1/chat/completions"]
                reply = await clients[replica].post(
                    "/v1/chat/completions", json=body, headers=headers
                )
                return reply.status_code

            assert [await call(0, "k"), await call(0, "k"), await call(1, "k")] == [200] * 3
            for limiter in (*limiters, limiters[0]):  # A adds 2, B adds 1 and reads 3, A reads 3
                assert await limiter.sync_once()
            assert [await call(0, "k"), await call(1, "k")] == [429, 429]
            assert [await call(1, "o"), await call(0, "o")] == [200, 200]
            for client in clients:
                await client.aclose()

    asyncio.run(main())
