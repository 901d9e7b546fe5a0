"""``GET /admin/tenants`` through the real HTTP stack (uvicorn, a SQLite file, the embedded
simulated node): two tenants' calls show up under their names with their service seconds and
shares (the runtime knows only their digests), and an unknown digest is shown as itself."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from talaria.core.status import InstanceStatus, TenantShare
from talaria.proxy.api.tenants import tenant_shares
from talaria.proxy.callpath.runner import tenant_digest
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.store.db import make_engine, make_sessionmaker
from talaria.proxy.store.migrate import upgrade_async
from talaria.proxy.store.repository import SqlStore
from tests.integration.server import RunningProxy, running_proxy

ADMIN = "tenants-admin-token"
MODEL = "glm-4.5-fp8"


def _keys(url: str) -> dict[str, str]:
    async def make() -> dict[str, str]:
        await upgrade_async(url)
        engine = make_engine(url)
        tenants = SqlStore(make_sessionmaker(engine)).tenants
        try:
            return {
                name: await tenants.create_api_key(await tenants.create_tenant(name))
                for name in ("acme", "globex")
            }
        finally:
            await engine.dispose()

    return asyncio.run(make())


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RunningProxy, dict[str, str]]]:
    url = f"sqlite+aiosqlite:///{Path(tmp_path_factory.mktemp('tenants')) / 'p.db'}"
    keys = _keys(url)
    # ×50, not faster: a call's measured service is in simulated seconds, and a host hiccup of
    # a few wall milliseconds beside other tests (CI) must not outweigh a call's own
    settings = ProxySettings(database_url=url, admin_token=ADMIN, time_scale=50.0)
    with running_proxy(settings) as running:
        yield running, keys


def test_each_tenants_share_of_the_service_is_listed_by_name(
    served: tuple[RunningProxy, dict[str, str]],
) -> None:
    proxy, keys = served
    calls = {"acme": (3, 64), "globex": (1, 8)}  # (calls, max_tokens): acme is served far more
    with httpx.Client(base_url=proxy.base_url, timeout=60) as http:
        for tenant, (n, max_tokens) in calls.items():
            for i in range(n):
                answer = http.post(
                    "/v1/chat/completions",
                    json={
                        "model": MODEL,
                        "max_tokens": max_tokens,
                        "messages": [{"role": "user", "content": f"{tenant} task {i} " * 40}],
                    },
                    headers={"authorization": f"Bearer {keys[tenant]}"},
                )
                assert answer.status_code == 200, answer.text
        assert http.get("/admin/tenants").status_code == 401
        doc = http.get("/admin/tenants", headers={"authorization": f"Bearer {ADMIN}"}).json()
    rows = {row["tenant"]: row for row in doc["data"]}
    assert set(rows) == {"acme", "globex"} and doc["unreachable"] == {}
    assert all(row["known"] and row["waiting_calls"] == 0 for row in rows.values())
    assert rows["acme"]["served_s"] > rows["globex"]["served_s"] > 0
    assert rows["acme"]["share"] + rows["globex"]["share"] == pytest.approx(1.0)
    assert [row["tenant"] for row in doc["data"]] == ["acme", "globex"]  # most served first


def test_shares_sum_over_instances_and_unknown_digests_show_as_themselves() -> None:
    acme = tenant_digest("t-acme")
    statuses = {
        "n0": InstanceStatus("n0", 1.0, None, {}, tenants={acme: TenantShare(30.0, 2, 1, 5.0)}),
        "n1": InstanceStatus(
            "n1",
            1.0,
            None,
            {},
            tenants={acme: TenantShare(10.0, 0, 1, 0.0), "f00d": TenantShare(40.0)},
        ),
    }
    rows = tenant_shares(statuses, {"t-acme": "acme"})
    assert [(r["tenant"], r["known"]) for r in rows] == [("acme", True), ("f00d", False)]
    acme_row = rows[0]
    assert (acme_row["served_s"], acme_row["waiting_calls"], acme_row["running_calls"]) == (
        40.0,
        2,
        2,
    )
    assert acme_row["oldest_wait_s"] == 5.0 and acme_row["share"] == 0.5
    assert set(acme_row["instances"]) == {"n0", "n1"}
    assert tenant_shares({}, {"t-acme": "acme"}) == []
