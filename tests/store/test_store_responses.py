"""Stored responses on both backends: each row keeps its ``size_bytes``; the quota's totals
per tenant (``SUM`` over the rows not expired, the earliest expiry) come from the store, a
delete returns the bytes it frees, and an upsert replaces the size."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from talaria.proxy.dialects.responses.tables import ResponseRecord
from talaria.proxy.store.db import make_engine
from talaria.proxy.store.migrate import upgrade_async
from talaria.proxy.store.repository import SqlStore
from tests.support import responses

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


def response(rid: str, tenant: str, size: int, expires: datetime) -> ResponseRecord:
    return ResponseRecord(
        response_id=rid,
        tenant_id=tenant,
        session_key="ses_1",
        model="glm",
        created_at=T0,
        expires_at=expires,
        response={"id": rid, "model": "glm", "output": []},
        input_items=[{"type": "message", "role": "user", "content": "hi", "id": "in_0"}],
        size_bytes=size,
    )


@pytest.mark.asyncio
async def test_sizes_are_summed_per_tenant_over_rows_not_expired(store: SqlStore) -> None:
    await store.write_batch(
        [
            response("a1", "A", 1_000, T0 + DAY),
            response("a2", "A", 2**33, T0 + 2 * DAY),  # past 32 bits: a BIGINT
            response("a3", "A", 50, T0 - DAY),  # expired: not counted
            response("b1", "B", 700, T0 + 3 * DAY),
        ]
    )
    assert await responses(store).response_bytes(T0) == {
        "A": (1_000 + 2**33, T0 + DAY),
        "B": (700, T0 + 3 * DAY),
    }
    assert await responses(store).response_bytes(T0 + 2 * DAY) == {"B": (700, T0 + 3 * DAY)}


@pytest.mark.asyncio
async def test_a_delete_returns_the_bytes_it_frees(store: SqlStore) -> None:
    await store.write_batch([response("a1", "A", 1_234, T0 + DAY)])
    assert await responses(store).delete_response("B", "a1") is None  # another tenant's: kept
    assert await responses(store).delete_response("A", "a1") == 1_234
    assert await responses(store).delete_response("A", "a1") is None
    assert await responses(store).response_bytes(T0) == {}


@pytest.mark.asyncio
async def test_an_upsert_replaces_the_size(store: SqlStore) -> None:
    await store.write_batch([response("a1", "A", 10, T0 + DAY)])
    await store.write_batch([response("a1", "A", 30, T0 + DAY)])
    assert await responses(store).response_bytes(T0) == {"A": (30, T0 + DAY)}


@pytest.mark.asyncio
async def test_on_sqlite_the_totals_read_only_the_covering_index(tmp_path: Path) -> None:
    """SQLite keeps a row's columns in order, so reading ``size_bytes`` from the table would
    walk the overflow pages of the JSON before it: the query must use the index alone."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'plan.db'}"
    await upgrade_async(url)
    engine = make_engine(url)
    query = (
        "EXPLAIN QUERY PLAN SELECT tenant_id, sum(size_bytes), min(expires_at) FROM responses"
        " WHERE expires_at > '2026-12-01' GROUP BY tenant_id"
    )
    try:
        async with engine.connect() as conn:
            plan = " ".join(str(row[-1]) for row in await conn.execute(text(query)))
    finally:
        await engine.dispose()
    assert "USING COVERING INDEX ix_responses_tenant_id_expires_at_size_bytes" in plan
