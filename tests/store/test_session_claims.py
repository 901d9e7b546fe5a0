"""Claims of a session's name (proxy/store/claims.py), on SQLite and PostgreSQL: of several
concurrent claims of one (tenant, session id), one inserts its session and every other gets
that one; a claimed session's row is then written by the batched writer as any other."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from talaria.proxy.contract.records import CallRecord, SessionRecord
from talaria.proxy.store.claims import name_lock_key
from talaria.proxy.store.repository import SqlStore

AT = datetime(2026, 12, 5, tzinfo=UTC)


def _claim(key: str, sid: str = "s", tenant: str = "t") -> SessionRecord:
    return SessionRecord(key, tenant, "m", AT, AT, session_id=sid, identity_source="talaria")


@pytest.mark.asyncio
async def test_concurrent_claims_of_one_name_open_one_session(store: SqlStore) -> None:
    claims = [_claim(f"ses_{i}") for i in range(6)]
    found = await asyncio.gather(
        *(store.sessions.open_root_session("t", "s", claim) for claim in claims)
    )
    keys = {summary.session_key for summary, _ in (f for f in found if f is not None)}
    assert len(keys) == 1 and len(found) == 6
    (key,) = keys
    summary, instance = found[0] or (None, None)
    assert summary is not None and summary.calls == 0 and instance is None
    assert summary.identity_source == "talaria" and summary.state == "active"
    other = await store.sessions.open_root_session("u", "s", _claim("ses_u", tenant="u"))
    assert other is not None and other[0].session_key == "ses_u"  # another tenant's name
    await store.write_batch(
        [
            CallRecord("r1", key, 0, "m", "node-a", AT, AT, "ok", prompt_tokens=5),
            _claim(key),
        ]
    )
    again = await store.sessions.open_root_session("t", "s")
    assert again is not None and again[0].calls == 1 and again[1] == "node-a"


@pytest.mark.asyncio
async def test_without_a_claim_nothing_is_inserted(store: SqlStore) -> None:
    assert await store.sessions.open_root_session("t", "s") is None
    assert await store.sessions.open_root_session("t", "s") is None


def test_the_lock_key_is_a_signed_bigint_per_name() -> None:
    keys = {name_lock_key(t, s) for t in ("t", "u") for s in ("s", "s2")}
    assert len(keys) == 4 and all(-(2**63) <= k < 2**63 for k in keys)
    assert name_lock_key("t", "s") == name_lock_key("t", "s")
    assert name_lock_key("t\x00", "s") != name_lock_key("t", "\x00s")
