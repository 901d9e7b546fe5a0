"""API keys you can trust: the key mode read live (a key made while the proxy runs is enforced),
never reopening, keys while the store is down, the bounded caches, and the /metrics token.

The proxy tests run a real proxy on a loopback port over a real SQLite file; the cache tests run
the ``Authenticator`` over a small fake store with a fake clock."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest

from talaria.proxy.callpath import auth as auth_module
from talaria.proxy.callpath.auth import Authenticator
from talaria.proxy.contract.calls import Caller
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.store.db import make_engine, make_sessionmaker
from talaria.proxy.store.migrate import upgrade_async
from talaria.proxy.store.repository import SqlStore
from tests.integration.server import running_proxy

LOCAL = "127.0.0.1"
REMOTE = "203.0.113.7"


def _settings(tmp: Path, **extra: object) -> ProxySettings:
    return ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp}/a.db",
        time_scale=500.0,
        **extra,  # type: ignore[arg-type]
    )


def _on_store(url: str, action: str, *args: str) -> str | bool | int:
    """Run one ``SqlStore`` method on the database at ``url`` (its own engine and loop)."""

    async def main() -> str | bool | int:
        await upgrade_async(url)
        engine = make_engine(url)
        try:
            store = SqlStore(make_sessionmaker(engine))
            if action == "create":
                return await store.tenants.create_api_key(
                    await store.tenants.create_tenant(args[0])
                )
            if action == "revoke_all":
                for info in await store.tenants.list_api_keys():
                    await store.tenants.revoke_api_key(info.id)
                return True
            raise AssertionError(action)
        finally:
            await engine.dispose()

    return asyncio.run(main())


def _models(base: str, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(base + "/v1/models", headers=headers)


def test_a_key_created_while_the_proxy_runs_is_enforced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MODE_TTL_S = 0: the mode is read on every call, so no test waits for a refresh.
    monkeypatch.setattr(auth_module, "MODE_TTL_S", 0.0, raising=False)
    settings = _settings(tmp_path)
    assert settings.database_url is not None
    with running_proxy(settings) as proxy:
        assert _models(proxy.base_url).status_code == 200  # open: a local caller, no key
        key = _on_store(settings.database_url, "create", "acme")
        assert isinstance(key, str)
        denied = _models(proxy.base_url)
        assert denied.status_code == 401, denied.text
        assert denied.json()["error"]["type"] == "authentication_error"
        assert _models(proxy.base_url, "tk-not-a-key").status_code == 401
        assert _models(proxy.base_url, key).status_code == 200
        # Closed for good: revoking every key does not reopen the running proxy.
        _on_store(settings.database_url, "revoke_all")
        assert _models(proxy.base_url).status_code == 401


def test_a_restart_with_only_revoked_keys_serves_nobody(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    assert settings.database_url is not None
    key = _on_store(settings.database_url, "create", "acme")
    assert isinstance(key, str)
    _on_store(settings.database_url, "revoke_all")
    with running_proxy(settings) as proxy:
        assert _models(proxy.base_url).status_code == 401  # a local caller, no key
        assert _models(proxy.base_url, key).status_code == 401  # the revoked key
    # --allow-open is the operator's explicit way to serve without a usable key.
    settings.allow_open = True
    with running_proxy(settings) as proxy:
        assert _models(proxy.base_url).status_code == 200


def test_metrics_token(tmp_path: Path) -> None:
    with running_proxy(_settings(tmp_path, metrics_token="m-secret")) as proxy:
        url = proxy.base_url + "/metrics"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "m-secret"}):
            denied = httpx.get(url, headers=headers)
            assert denied.status_code == 401, headers
            assert denied.json()["error"]["type"] == "authentication_error"
            assert "talaria_" not in denied.text
        allowed = httpx.get(url, headers={"Authorization": "Bearer m-secret"})
        assert allowed.status_code == 200
        assert "talaria_store_pending_records" in allowed.text


# -- the Authenticator over a fake store --------------------------------------------------


class FakeStore:
    """Keys in a dict; ``down`` makes every read raise; ``lookups`` counts key lookups."""

    def __init__(self, keys: dict[str, str] | None = None, ever: int | None = None) -> None:
        self.keys = dict(keys or {})
        self.ever = len(self.keys) if ever is None else ever
        self.down = False
        self.lookups = 0
        self.counts = 0

    async def caller_for_key(self, plaintext: str) -> Caller | None:
        self.lookups += 1
        if self.down:
            raise ConnectionRefusedError("store down")
        tenant = self.keys.get(plaintext)
        return None if tenant is None else Caller(tenant)

    async def count_api_keys(self, *, active_only: bool = False) -> int:
        self.counts += 1
        if self.down:
            raise ConnectionRefusedError("store down")
        return len(self.keys) if active_only else self.ever


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _status(call: object) -> int:
    """The status of the ``ApiError`` an awaitable raises (0 if it returns)."""

    async def main() -> int:
        try:
            await call  # type: ignore[misc]
        except ApiError as exc:
            return exc.status
        return 0

    return asyncio.run(main())


def _tenant(auth: Authenticator, key: str | None, host: str = REMOTE) -> str:
    return asyncio.run(auth.tenant(f"Bearer {key}" if key else None, host))


def test_keys_keep_working_from_the_cache_while_the_store_is_down() -> None:
    store, clock = FakeStore({"good": "acme"}), FakeClock()
    auth = Authenticator([], store, clock=clock, cache_ttl_s=30.0)
    assert _tenant(auth, "good") == "acme"
    assert _status(auth.tenant("Bearer wrong", REMOTE)) == 401
    store.down = True
    clock.now += 3600.0  # both entries long expired
    assert _tenant(auth, "good") == "acme"
    assert _tenant(auth, "good") == "acme"
    assert _status(auth.tenant("Bearer wrong", REMOTE)) == 401  # known invalid: still 401
    with pytest.raises(ApiError) as unknown:
        _tenant(auth, "never-seen")
    assert unknown.value.status == 503
    assert unknown.value.headers()["Retry-After"] == "2"
    assert _status(auth.tenant(None, REMOTE)) == 401  # no key at all: 401, not 503
    # The store is back: a key revoked meanwhile is refused again.
    store.down = False
    del store.keys["good"]
    assert _status(auth.tenant("Bearer good", REMOTE)) == 401


def test_the_mode_is_kept_while_the_store_cannot_be_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock = FakeStore(), FakeClock()
    auth = Authenticator([], store, clock=clock, mode_ttl_s=2.0)
    assert _tenant(auth, None, LOCAL) == "local"
    assert _status(auth.tenant(None, REMOTE)) == 401  # open serves loopback callers only
    store.down = True
    with caplog.at_level(logging.WARNING, logger="talaria.proxy.callpath.auth"):
        for _ in range(3):
            clock.now += 2.5
            assert _tenant(auth, None, LOCAL) == "local"  # the previous mode: open
    failures = [r for r in caplog.records if "cannot read the API key mode" in r.message]
    assert len(failures) == 1  # one warning per failure streak
    assert store.counts == 4  # one read per MODE_TTL_S, not one per call
    store.down = False
    store.keys["k"] = "acme"
    store.ever = 1
    assert _tenant(auth, None, LOCAL) == "local"  # read 0.0 s ago: within MODE_TTL_S
    clock.now += 2.0
    assert _status(auth.tenant(None, LOCAL)) == 401  # a key exists: closed
    assert _tenant(auth, "k", LOCAL) == "acme"
    # Closed for good: no key left (and the store says so) does not reopen it.
    store.keys.clear()
    store.ever = 0
    clock.now += 60.0
    assert _status(auth.tenant(None, LOCAL)) == 401
    assert not auth.open


def test_allow_open_serves_remote_callers_only_while_no_key_is_usable() -> None:
    store, clock = FakeStore(), FakeClock()
    auth = Authenticator([], store, allow_open=True, clock=clock, mode_ttl_s=0.0)
    assert _tenant(auth, None, REMOTE) == "local"
    store.keys["k"] = "acme"
    assert _status(auth.tenant(None, REMOTE)) == 401
    assert _tenant(auth, "k", REMOTE) == "acme"
    # Env keys close it from the start, whatever the store says.
    env = Authenticator(["env-key"], FakeStore(), allow_open=True, clock=clock)
    assert _status(env.tenant(None, LOCAL)) == 401
    assert _tenant(env, "env-key") == "default"


def test_a_flood_of_wrong_keys_is_bounded_and_keeps_valid_keys_cached() -> None:
    store, clock = FakeStore({"good": "acme"}, ever=1), FakeClock()
    auth = Authenticator([], store, clock=clock)

    async def flood() -> int:
        assert await auth.tenant("Bearer good", REMOTE) == "acme"
        refused = 0
        for i in range(30_000):
            try:
                await auth.tenant(f"Bearer wrong-{i}", REMOTE)
            except ApiError as exc:
                assert exc.status == 401
                refused += 1
        return refused

    assert asyncio.run(flood()) == 30_000
    valid, invalid = auth.cached_keys
    assert valid == 1 and invalid == auth_module.INVALID_CACHE_SIZE
    lookups = store.lookups
    assert lookups == 30_001  # one query per distinct key
    assert _tenant(auth, "good") == "acme"
    assert store.lookups == lookups  # still cached: no query
    assert _status(auth.tenant("Bearer wrong-29999", REMOTE)) == 401
    assert store.lookups == lookups  # a recent wrong key is cached too
    assert _status(auth.tenant("Bearer wrong-0", REMOTE)) == 401
    assert store.lookups == lookups + 1  # the oldest wrong keys were dropped
