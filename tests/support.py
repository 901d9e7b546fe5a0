"""Fakes and helpers shared by the tests, one of each (``from tests.support import ...``).

A port on loopback that is free now is ``bench.harness.processes.free_port`` (bench/ cannot
import the tests, and its harness needs one too); the folders' own helpers sit beside their
tests (tests/integration/server.py, tests/real/servers.py, tests/e2e/replicas.py,
tests/vllm/runtime_process.py, tests/sdk/support.py); the fake OpenAI-compatible upstream server
the unit and integration tests share is tests/fake_upstream.py. Files of the repository are
found from ``REPO_ROOT``, whatever folder a test sits in.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import httpx
import pytest

from talaria.proxy.contract.records import Record, ReservationRecord

if TYPE_CHECKING:
    from talaria.proxy.dialects.responses.tables import ResponseTables
    from talaria.proxy.store.repository import SqlStore

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The repository's root folder."""


class ListSink:
    """A record sink that keeps every record; each is committed at once."""

    full = False
    failing_since = None

    def __init__(self) -> None:
        self.records: list[Record] = []

    def submit(self, record: Record) -> int:
        self.records.append(record)
        return len(self.records)

    async def committed(self, seq: int) -> None:
        assert seq <= len(self.records)

    def reservations(self) -> list[ReservationRecord]:
        return [r for r in self.records if isinstance(r, ReservationRecord)]


def near_budget(items: int) -> dict[str, Any]:
    """A tool's schema: an object whose required array asks for ``items`` integers (a
    request's schemas build within 4,096 values: core/schema_instance.py)."""
    xs = {"type": "array", "minItems": items, "items": {"type": "integer"}}
    return {"type": "object", "required": ["xs"], "properties": {"xs": xs}}


def responses(store: SqlStore) -> ResponseTables:
    """The Responses dialect's own tables, on the store's sessions."""
    from talaria.proxy.dialects.responses.tables import ResponseTables

    return ResponseTables(store.sessionmaker)


def unavailable(message: str, under_ci: str | None = None) -> NoReturn:
    """What a test does without something the machine lacks (a server, a binary, a model): a
    skip, but a failure under CI (``CI`` set), where scripts/test.sh provides everything;
    ``under_ci``: the failure's message, if not ``message``."""
    __tracebackhide__ = True  # the skip is reported at the line that called this
    if os.environ.get("CI"):
        pytest.fail(under_ci or message)
    pytest.skip(message)


PG_ENV = "TALARIA_TEST_PG_URL"
"""The PostgreSQL database the tests may use (scripts/test.sh starts a server; under
pytest-xdist tests/conftest.py points the variable at the worker's own database)."""


def pg_url() -> str:
    """The database ``TALARIA_TEST_PG_URL`` names, or :func:`unavailable` without it."""
    __tracebackhide__ = True
    url = os.environ.get(PG_ENV)
    if not url:
        unavailable(f"{PG_ENV} is not set (scripts/test.sh starts PostgreSQL and sets it)")
    return url


async def reset_postgres(url: str) -> None:
    """Empty the database: drop and recreate the public schema (tables, alembic_version)."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("DROP SCHEMA IF EXISTS public CASCADE"))
            await conn.execute(text("CREATE SCHEMA public"))
    finally:
        await engine.dispose()


def admin_get(base_url: str, token: str, path: str, timeout_s: float = 30.0) -> Any:
    """GET ``path`` of a proxy's admin API with ``token``: its JSON (a 200, or the test fails
    with the reply's text)."""
    reply = httpx.get(
        base_url + path, headers={"authorization": f"Bearer {token}"}, timeout=timeout_s
    )
    assert reply.status_code == 200, reply.text
    return reply.json()


def chat_requests(base_url: str) -> dict[str, float]:
    """A server's ``talaria_requests_total`` of ``/v1/chat/completions`` by status (its
    ``/metrics``)."""
    text = httpx.get(base_url + "/metrics", timeout=10).text
    prefix = 'talaria_requests_total{route="/v1/chat/completions",status="'
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            status, _, value = line[len(prefix) :].partition('"} ')
            out[status] = float(value)
    return out


def until(ok: Callable[[], object], seconds: float = 30.0, every_s: float = 0.2) -> bool:
    """Ask ``ok()`` every ``every_s`` until it is true or ``seconds`` have passed; whether it is
    true at the end. For a real process's state (other processes' records, metrics, slots):
    there is no event to wait on."""
    deadline = time.monotonic() + seconds
    while not ok() and time.monotonic() < deadline:
        threading.Event().wait(every_s)
    return bool(ok())


BOX = re.compile(r"[│╭╮╰╯─┃━]")


def flat(text: str) -> str:
    """A CLI's output with rich's panel borders dropped and every run of whitespace one space,
    so that a message wrapped inside Typer's error panel reads as one line again."""
    return " ".join(BOX.sub(" ", text).split())
