"""Keyset paging: for any set of sessions, paging through with any page sizes yields every
session exactly once, in (started_at desc, session_key desc) order."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from talaria.proxy.contract.records import SessionRecord
from talaria.proxy.store.repository import SqlStore

T0 = datetime(2026, 11, 1, tzinfo=UTC)

# Few distinct start times (many ties, broken by session_key), microsecond offsets included.
starts = st.sampled_from([0, 1, 2, 3, 1_000_001, 86_400_000_000]).map(
    lambda us: T0 + timedelta(microseconds=us)
)
session_sets = st.dictionaries(
    st.text(alphabet="abcdefgXYZ0189-_", min_size=1, max_size=6), starts, max_size=25
)


@pytest.mark.asyncio
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(sessions=session_sets, page_sizes=st.lists(st.integers(1, 7), min_size=1, max_size=10))
async def test_paging_yields_every_session_once_in_order(
    store: SqlStore, db_url: str, sessions: dict[str, datetime], page_sizes: list[int]
) -> None:
    tenant = uuid.uuid4().hex  # examples share the database: each lists only its own tenant
    await store.write_batch(
        [SessionRecord(f"{tenant}:{sid}", tenant, "glm", at, at) for sid, at in sessions.items()]
    )
    whole = await store.sessions.list_sessions(tenant_id=tenant, limit=1000)
    expected = [(s.started_at, s.session_key) for s in whole.items]
    # Newest first; ties by session_key in the database's collation (bytewise on SQLite).
    assert sorted(expected) == sorted((at, f"{tenant}:{sid}") for sid, at in sessions.items())
    assert [at for at, _ in expected] == sorted((at for at, _ in expected), reverse=True)
    if db_url.startswith("sqlite"):
        assert expected == sorted(expected, key=lambda p: (p[0], p[1].encode()), reverse=True)
    seen: list[tuple[datetime, str]] = []
    cursor: str | None = None
    for turn in range(len(sessions) + 2):
        page = await store.sessions.list_sessions(
            tenant_id=tenant, cursor=cursor, limit=page_sizes[turn % len(page_sizes)]
        )
        seen.extend((s.started_at, s.session_key) for s in page.items)
        cursor = page.next_cursor
        if cursor is None:
            break
        assert page.items, "a page with a next cursor is never empty"
    assert cursor is None
    assert seen == expected
