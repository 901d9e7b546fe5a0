"""The storage quota of stored responses through the real HTTP stack (uvicorn on a loopback
port, a real SQLite file, two tenants with store keys): a tenant that fills its quota gets 429
``storage_quota_exceeded`` with Retry-After while another tenant stores on, until the global
cap; ``store: false`` always works; a deletion frees quota at once; a restarted proxy reads
the totals back from the store."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.store.db import make_engine, make_sessionmaker
from talaria.proxy.store.migrate import upgrade_async
from talaria.proxy.store.repository import SqlStore
from tests.integration.server import running_proxy

MODEL = "glm-4.5-fp8"
TEXT = "a" * 20_000
"""Each response stores about 21.5 KB: this input, the response object and a short output."""
TENANT_QUOTA, MAX_BYTES = 60_000, 80_000
TTL_S = 7 * 24 * 3600.0


def _keys(url: str) -> tuple[str, str]:
    async def create() -> tuple[str, str]:
        await upgrade_async(url)
        engine = make_engine(url)
        store = SqlStore(make_sessionmaker(engine))
        try:
            a = await store.tenants.create_api_key(await store.tenants.create_tenant("tenant-a"))
            b = await store.tenants.create_api_key(await store.tenants.create_tenant("tenant-b"))
        finally:
            await engine.dispose()
        return a, b

    return asyncio.run(create())


def _create(http: httpx.Client, key: str, **extra: Any) -> httpx.Response:
    body = {"model": MODEL, "input": TEXT, "max_output_tokens": 16, **extra}
    return http.post("/v1/responses", json=body, headers={"Authorization": f"Bearer {key}"})


def _refused(reply: httpx.Response, limit: str) -> None:
    assert reply.status_code == 429, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["type"], error["param"]) == (
        "storage_quota_exceeded",
        "rate_limit_error",
        "store",
    )
    assert limit in error["message"]
    # until the oldest stored response expires: about the TTL, as all were stored just now
    assert TTL_S - 600 < int(reply.headers["retry-after"]) <= TTL_S


def test_quotas_refuse_storing_and_deletions_free_them(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/q.db"
    key_a, key_b = _keys(url)
    settings = ProxySettings(
        database_url=url,
        models=[MODEL],
        time_scale=500.0,
        responses_tenant_quota_bytes=TENANT_QUOTA,
        responses_max_bytes=MAX_BYTES,
    )
    with (
        running_proxy(settings) as proxy,
        httpx.Client(base_url=proxy.base_url, timeout=30) as http,
    ):
        kept = [_create(http, key_a) for _ in range(2)]
        assert [r.status_code for r in kept] == [200, 200]
        _refused(_create(http, key_a), "this tenant's")
        assert _create(http, key_a, store=False).status_code == 200  # nothing to keep
        assert _create(http, key_b).status_code == 200  # another tenant stores on...
        _refused(_create(http, key_b), "the server's")  # ...until all of them fill the cap
        deleted = http.delete(
            f"/v1/responses/{kept[0].json()['id']}", headers={"Authorization": f"Bearer {key_a}"}
        )
        assert deleted.status_code == 200
        assert _create(http, key_a).status_code == 200  # the deletion freed A's quota
        _refused(_create(http, key_a, stream=True), "this tenant's")  # refused before a stream
    with (
        running_proxy(settings) as proxy,
        httpx.Client(base_url=proxy.base_url, timeout=30) as http,
    ):  # a new process counts what the store holds
        _refused(_create(http, key_a), "this tenant's")
        assert _create(http, key_a, store=False).status_code == 200
