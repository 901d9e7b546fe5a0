"""Concurrent first calls of one session on two replicas make one session (issue 46, Low: with
``TALARIA_REPLICA_AFFINITY=ingress`` they made two). Two proxy apps on one PostgreSQL database
in this process, each with a runtime that holds its call until the test lets both go: the
first call reaches replica A and runs; the second, with the same session header, reaches
replica B while A's has written nothing yet. The store decides which claim of the (tenant,
session id) came first (proxy/store/claims.py); the other replica adopts that session.

PostgreSQL: ``TALARIA_TEST_PG_URL`` (scripts/test.sh starts one); skipped without it, except
under CI."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack
from typing import Any

import httpx
from sqlalchemy import select

from talaria.core.types import CallRequest, GenerationEvent
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.edge.app import create_app
from talaria.proxy.store.db import make_engine
from talaria.proxy.store.models import CallRow, SessionRow
from talaria.runtime.instant import InstantRuntime
from tests.support import pg_url, reset_postgres

MODEL = "m"
SECRET = "claims-cluster-secret-0123456789abcdef"


class HeldRuntime(InstantRuntime):
    """Answers at once, but only once ``gate`` is set; ``started`` when a call arrived."""

    def __init__(self, gate: asyncio.Event, name: str) -> None:
        super().__init__((MODEL,), name=name, output_tokens=2)
        self.gate = gate
        self.started = asyncio.Event()

    async def _generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        self.started.set()
        await self.gate.wait()
        async for event in super()._generate(request):
            yield event


def _replica(url: str, name: str, runtime: InstantRuntime) -> Any:
    settings = ProxySettings(
        database_url=url,
        replica_url=f"http://{name}.invalid:8000",
        cluster_secret=SECRET,
        replica_affinity="ingress",
        replica_heartbeat_s=0.2,
    )
    return create_app(settings, runtimes=[runtime])


async def _sessions(url: str, session_id: str) -> tuple[list[str], dict[str, int]]:
    """The keys of the stored sessions the client calls ``session_id``, and the stored calls
    per key."""
    engine = make_engine(url)
    try:
        async with engine.connect() as db:
            keys = list(
                await db.scalars(
                    select(SessionRow.session_key).where(SessionRow.session_id == session_id)
                )
            )
            calls: dict[str, int] = {}
            for key in await db.scalars(
                select(CallRow.session_key).where(CallRow.session_key.in_(keys))
            ):
                calls[key] = calls.get(key, 0) + 1
            return keys, calls
    finally:
        await engine.dispose()


def test_concurrent_first_calls_on_two_ingress_replicas_make_one_session() -> None:
    url = pg_url()

    async def main() -> tuple[list[httpx.Response], list[str], dict[str, int]]:
        await reset_postgres(url)
        gate = asyncio.Event()
        runtimes = [HeldRuntime(gate, "instant-a"), HeldRuntime(gate, "instant-b")]
        apps = [_replica(url, name, rt) for name, rt in zip("ab", runtimes, strict=True)]
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Plan the fix."}]}
        headers = {"x-talaria-session-id": "first-calls"}
        async with AsyncExitStack() as stack:
            clients = []
            for app in apps:  # one after the other: each migrates the schema at start
                await stack.enter_async_context(app.router.lifespan_context(app))
                transport = httpx.ASGITransport(app=app)
                clients.append(
                    await stack.enter_async_context(
                        httpx.AsyncClient(transport=transport, base_url="http://proxy")
                    )
                )
            calls = []
            for client, runtime in zip(clients, runtimes, strict=True):
                calls.append(
                    asyncio.create_task(
                        client.post("/v1/chat/completions", json=body, headers=headers)
                    )
                )
                await asyncio.wait_for(runtime.started.wait(), 30)  # running on its replica
            gate.set()
            replies = list(await asyncio.gather(*calls))
        keys, counts = await _sessions(url, "first-calls")
        return replies, keys, counts

    replies, keys, counts = asyncio.run(main())
    assert [r.status_code for r in replies] == [200, 200], [r.text for r in replies]
    assert len(keys) == 1, f"two replicas made {len(keys)} sessions of one: {keys}"
    assert counts == {keys[0]: 2}
    assert {r.headers["x-talaria-session-key"] for r in replies} == {keys[0]}
