"""A stateful dialect is one folder plus one registry line (issue 37): a toy "tally" dialect,
declared here as a folder would declare it, keeps state of its own (a tally per tenant,
loaded from its own table when it starts), runs a background task, checks its requests'
schemas under its own format param, and writes a record of its own table with each call
(a ``TableRecord``: the batched writer upserts it by key within its tenant). Given
``DIALECTS + (TALLY,)``, the proxy starts its service before it serves (after the store),
its routes reach it by name, each call's record is committed with the call's, and the service
is closed when the proxy stops. Its table is created here by its service (a real dialect's
table also needs an Alembic revision, as every table does: docs/architecture.md, "How to add
a dialect")."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel
from sqlalchemy import Integer, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from talaria.core.calls import Call, Sampling
from talaria.proxy.callpath.context import json_response
from talaria.proxy.callpath.door import open_call, read_body
from talaria.proxy.contract.calls import ApiCall, CallOutcome
from talaria.proxy.contract.records import Record, TableRecord
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.dialects.base import Dialect, DialectSite, request_body, service_of
from talaria.proxy.dialects.common import parse
from talaria.proxy.dialects.registry import DIALECTS
from talaria.runtime.instant import InstantRuntime
from tests.integration.server import running_proxy

MODEL = "bench-model"
EVENTS: list[str] = []


class TallyBase(DeclarativeBase):
    """The toy's own declarative base, so that its table stays out of the store's metadata
    (a real dialect's joins it: proxy/dialects/responses/tables.py)."""


class TallyRow(TallyBase):
    """The dialect's own table: one row per tenant."""

    __tablename__ = "toy_tallies"

    tenant_id: Mapped[str] = mapped_column(String, primary_key=True)
    calls: Mapped[int] = mapped_column(Integer)


@dataclass(frozen=True)
class TallyRecord(TableRecord):
    """A tenant's tally, written with each of its calls."""

    ROW: ClassVar[Any] = TallyRow
    KEY: ClassVar[str] = "tenant_id"
    OWNER: ClassVar[str] = "tenant_id"

    tenant_id: str
    calls: int


class Tally:
    """The dialect's service: the tallies, loaded at start; a task that beats while it runs."""

    def __init__(self, site: DialectSite) -> None:
        self._sessionmaker = site.store.sessionmaker
        self.tallies: dict[str, int] = {}
        self.beats = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        async with self._sessionmaker() as db:
            connection = await db.connection()
            await connection.run_sync(lambda c: TallyRow.__table__.create(c, checkfirst=True))
            await db.commit()
            rows = await db.scalars(select(TallyRow))
            self.tallies = {row.tenant_id: row.calls for row in rows}
        self._task = asyncio.get_running_loop().create_task(self._beat())
        EVENTS.append(f"started with {sum(self.tallies.values())} calls")

    async def _beat(self) -> None:
        while True:
            self.beats += 1
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        EVENTS.append("closed")


class TallyRequest(BaseModel):
    """The tally dialect's body."""

    model: str
    say: str
    shape: dict[str, Any] | None = None


router = APIRouter()


@router.post("/v1/tally", openapi_extra=request_body(TallyRequest))
async def tally(request: Request) -> Response:
    ctx, raw = await read_body(request)
    tenant = ctx.tenant
    body = parse(TallyRequest, raw, status=400)
    fmt = {"type": "json_schema", "json_schema": {"schema": body.shape}} if body.shape else None
    messages = ({"role": "user", "content": body.say},)
    call = Call(model=body.model, messages=messages, sampling=Sampling(response_format=fmt))
    state = service_of(request, "tally", Tally)

    def keep(outcome: CallOutcome) -> list[Record]:
        state.tallies[tenant] = state.tallies.get(tenant, 0) + 1
        return [TallyRecord(tenant, state.tallies[tenant])]

    parsed = ApiCall("tally", call, raw, format_param="shape", extra_records=keep)
    handle = await open_call(ctx, parsed)
    await handle.outcome()
    return json_response(
        {"calls": state.tallies[tenant], "beats": state.beats}, headers=handle.headers()
    )


TALLY = Dialect("tally", router, (TallyRequest,), service=Tally)
"""Its one registry line (here: the proxy is given ``DIALECTS + (TALLY,)``)."""


def _serve(cfg: ProxySettings, calls: int) -> list[httpx.Response]:
    runtime = InstantRuntime((MODEL,), output_tokens=4)
    with running_proxy(cfg, runtimes=[runtime], dialects=(*DIALECTS, TALLY)) as proxy:
        return [
            httpx.post(proxy.base_url + "/v1/tally", json={"model": MODEL, "say": "hi"})
            for _ in range(calls)
        ]


def test_a_stateful_dialect_starts_serves_keeps_its_table_and_closes(tmp_path: Any) -> None:
    cfg = ProxySettings(database_url=f"sqlite+aiosqlite:///{tmp_path}/t.db")
    EVENTS.clear()
    first = _serve(cfg, 3)
    assert [r.json()["calls"] for r in first] == [1, 2, 3]
    assert EVENTS == ["started with 0 calls", "closed"]
    again = _serve(cfg, 1)  # a restart: its service loads its table back
    assert again[0].json()["calls"] == 4 and again[0].json()["beats"] > 0
    assert EVENTS[2:] == ["started with 3 calls", "closed"]


def test_its_schema_check_names_its_own_format_param(tmp_path: Any) -> None:
    cfg = ProxySettings(database_url=f"sqlite+aiosqlite:///{tmp_path}/t.db")
    bomb = {"type": "array", "minItems": 10**9, "items": {"type": "string"}}
    runtime = InstantRuntime((MODEL,), output_tokens=4)
    with running_proxy(cfg, runtimes=[runtime], dialects=(*DIALECTS, TALLY)) as proxy:
        reply = httpx.post(
            proxy.base_url + "/v1/tally", json={"model": MODEL, "say": "hi", "shape": bomb}
        )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == ("schema_too_large", "shape")
