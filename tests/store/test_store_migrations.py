"""Migrations: up, down to base, up again, on both backends; the migrated schema is the
models' schema; the ``talaria db`` commands; default locations."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine
from typer.testing import CliRunner

from bench.harness.processes import talaria_command
from talaria.core.types import Priority
from talaria.proxy.contract.calls import Caller, RateLimits, Share
from talaria.proxy.contract.records import CallRecord, SessionRecord
from talaria.proxy.dialects.registry import DIALECTS
from talaria.proxy.store import db as store_db
from talaria.proxy.store import migrate
from talaria.proxy.store.cli import db_app
from talaria.proxy.store.db import make_engine, make_sessionmaker
from talaria.proxy.store.models import Base
from talaria.proxy.store.repository import SqlStore
from talaria.proxy.store.tenants import hash_key

TABLES = {
    "tenants",
    "dead_letters",
    "api_keys",
    "sessions",
    "calls",
    "routing_decisions",
    "reservations",
    "hints",
    "runtime_instances",
    "responses",
    "proxy_replicas",
    "instance_drains",
    "key_usage",
}


async def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: inspect(c).get_table_names())
    finally:
        await engine.dispose()
    return set(names) - {"alembic_version"}


def _diff(conn: Connection) -> list[Any]:
    assert DIALECTS  # their own tables (the Responses dialect's) are in Base.metadata
    context = MigrationContext.configure(conn, opts={"compare_type": True})
    return list(compare_metadata(context, Base.metadata))


@pytest.mark.asyncio
async def test_upgrade_downgrade_upgrade(db_url: str) -> None:
    assert await migrate.current_async(db_url) is None
    await migrate.upgrade_async(db_url)
    assert await migrate.current_async(db_url) == migrate.head() == "0015"
    assert await _tables(db_url) == TABLES
    await asyncio.to_thread(migrate.downgrade, db_url, "base")
    assert await migrate.current_async(db_url) is None
    assert await _tables(db_url) == set()
    await migrate.upgrade_async(db_url)
    assert await _tables(db_url) == TABLES


@pytest.mark.asyncio
async def test_0002_keeps_existing_sessions_under_their_client_ids(db_url: str) -> None:
    """Before 0002 a session's key was the client's id: the upgrade copies it to external_id,
    and the downgrade drops the new columns and table."""
    await migrate.upgrade_async(db_url, "0001")
    engine = make_engine(db_url)
    insert = text(
        "INSERT INTO sessions (session_id, tenant_id, model, state, started_at, last_call_at,"
        " calls, prompt_tokens, cached_tokens, output_tokens)"
        " VALUES ('task-7', 't', 'm', 'ended', :at, :at, 1, 10, 0, 5)"
    )
    try:
        async with engine.begin() as conn:
            await conn.execute(insert, {"at": datetime(2026, 11, 1, tzinfo=UTC)})
        await migrate.upgrade_async(db_url, "0002")
        async with engine.connect() as conn:
            row = (await conn.execute(text("SELECT session_id, external_id FROM sessions"))).one()
        assert tuple(row) == ("task-7", "task-7")
        await migrate.upgrade_async(db_url)  # 0008 renames them: the key, the client's id
        async with engine.connect() as conn:
            row = (await conn.execute(text("SELECT session_key, session_id FROM sessions"))).one()
        assert tuple(row) == ("task-7", "task-7")
        await asyncio.to_thread(migrate.downgrade, db_url, "0001")
        async with engine.connect() as conn:
            names = await conn.run_sync(
                lambda c: [col["name"] for col in inspect(c).get_columns("sessions")]
            )
        assert "external_id" not in names and "responses" not in await _tables(db_url)
    finally:
        await engine.dispose()


async def _columns(engine: AsyncEngine, table: str) -> list[str]:
    async with engine.connect() as conn:
        return await conn.run_sync(lambda c: [col["name"] for col in inspect(c).get_columns(table)])


async def _insert_call(engine: AsyncEngine) -> None:
    """One session with one call (queue_s 1.5) in the columns every revision has."""
    at = datetime(2026, 11, 1, tzinfo=UTC)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO sessions (session_id, tenant_id, external_id, model, state,"
                " started_at, last_call_at, calls, prompt_tokens, cached_tokens,"
                " output_tokens) VALUES ('s', 't', 's', 'm', 'active', :at, :at, 1, 0, 0, 0)"
            ),
            {"at": at},
        )
        await conn.execute(
            text(
                "INSERT INTO calls (request_id, session_id, call_index, model, arrived_at,"
                " status, queue_s, prompt_tokens, cached_tokens, output_tokens, stream)"
                " VALUES ('r', 's', 0, 'm', :at, 'ok', 1.5, 0, 0, 0, false)"
            ),
            {"at": at},
        )


@pytest.mark.asyncio
async def test_0004_adds_and_drops_calls_slot_wait_keeping_existing_calls(db_url: str) -> None:
    """A call recorded before 0004 reads back with a null ``slot_wait_s``; the downgrade drops
    the column and keeps the call."""
    await migrate.upgrade_async(db_url, "0003")
    engine = make_engine(db_url)
    try:
        await _insert_call(engine)
        assert "slot_wait_s" not in await _columns(engine, "calls")
        await migrate.upgrade_async(db_url)
        async with engine.connect() as conn:
            row = (await conn.execute(text("SELECT queue_s, slot_wait_s FROM calls"))).one()
        assert tuple(row) == (1.5, None)
        await asyncio.to_thread(migrate.downgrade, db_url, "0003")
        assert "slot_wait_s" not in await _columns(engine, "calls")
        async with engine.connect() as conn:
            kept = (await conn.execute(text("SELECT request_id, queue_s FROM calls"))).one()
        assert tuple(kept) == ("r", 1.5)
    finally:
        await engine.dispose()


@pytest.mark.asyncio
async def test_0006_adds_and_drops_the_engine_timed_parts_keeping_existing_calls(
    db_url: str,
) -> None:
    """A call recorded before 0006 reads back with null engine-timed parts; the downgrade drops
    the four columns and keeps the call."""
    engine_columns = {"engine_intake_s", "engine_queue_s", "engine_prefill_s", "engine_decode_s"}
    await migrate.upgrade_async(db_url, "0005")
    engine = make_engine(db_url)
    try:
        await _insert_call(engine)
        assert not engine_columns & set(await _columns(engine, "calls"))
        await migrate.upgrade_async(db_url)
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT queue_s, engine_intake_s, engine_queue_s, engine_prefill_s,"
                        " engine_decode_s FROM calls"
                    )
                )
            ).one()
        assert tuple(row) == (1.5, None, None, None, None)
        await asyncio.to_thread(migrate.downgrade, db_url, "0005")
        assert not engine_columns & set(await _columns(engine, "calls"))
        async with engine.connect() as conn:
            kept = (await conn.execute(text("SELECT request_id, queue_s FROM calls"))).one()
        assert tuple(kept) == ("r", 1.5)
    finally:
        await engine.dispose()


@pytest.mark.asyncio
async def test_0007_sizes_the_stored_responses_and_drops_the_size_again(db_url: str) -> None:
    """A response stored before 0007 gets the bytes of its columns' text as its size (so the
    quota counts it); the downgrade drops the column and its index and keeps the response."""
    await migrate.upgrade_async(db_url, "0006")
    engine = make_engine(db_url)
    at = datetime(2026, 12, 1, tzinfo=UTC)
    strings = ("resp_1", "t", "ses_1", "glm")
    response, items = '{"id":"resp_1","output":[]}', '[{"type":"message","content":"hé"}]'
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO responses (response_id, tenant_id, session_id, model,"
                    " created_at, expires_at, response, input_items)"
                    " VALUES ('resp_1', 't', 'ses_1', 'glm', :at, :at, :response, :items)"
                ),
                {"at": at, "response": response, "items": items},
            )
        await migrate.upgrade_async(db_url)
        async with engine.connect() as conn:
            size = (await conn.execute(text("SELECT size_bytes FROM responses"))).scalar()
        expected = sum(len(s.encode()) for s in (response, items, *strings)) + 16
        assert size == expected
        await asyncio.to_thread(migrate.downgrade, db_url, "0006")
        assert "size_bytes" not in await _columns(engine, "responses")
        async with engine.connect() as conn:
            kept = (await conn.execute(text("SELECT response_id FROM responses"))).scalar()
            indexes = await conn.run_sync(lambda c: inspect(c).get_indexes("responses"))
        assert kept == "resp_1"
        assert {i["name"] for i in indexes} == {"ix_responses_tenant_id", "ix_responses_expires_at"}
    finally:
        await engine.dispose()


SESSION_TABLES = ("calls", "routing_decisions", "reservations", "hints", "responses")
"""The tables other than ``sessions`` whose rows name a session by its key."""


async def _indexes(engine: AsyncEngine, table: str) -> dict[str, list[str]]:
    async with engine.connect() as conn:
        found = await conn.run_sync(lambda c: inspect(c).get_indexes(table))
    return {i["name"]: list(i["column_names"]) for i in found}


async def _foreign_keys(engine: AsyncEngine, table: str) -> list[tuple[Any, ...]]:
    async with engine.connect() as conn:
        found = await conn.run_sync(lambda c: inspect(c).get_foreign_keys(table))
    return [
        (f["name"], f["constrained_columns"], f["referred_table"], f["referred_columns"])
        for f in found
    ]


@pytest.mark.asyncio
async def test_0008_renames_the_key_and_the_client_id_keeping_every_row(db_url: str) -> None:
    """0008: ``sessions.session_id`` (the key) becomes ``session_key``, then ``external_id``
    (the client's id) becomes ``session_id``, the parent's key ``parent_session_key``, and every
    other table's ``session_id`` ``session_key``; indexes follow. Values stay; the downgrade
    gives the old names back."""
    await migrate.upgrade_async(db_url, "0007")
    engine = make_engine(db_url)
    at = datetime(2026, 12, 1, tzinfo=UTC)
    inserts = (
        "INSERT INTO sessions (session_id, tenant_id, external_id, parent_session_id, model,"
        " state, started_at, last_call_at, calls, prompt_tokens, cached_tokens, output_tokens)"
        " VALUES ('ses_1', 't', 'task-1', 'ses_0', 'm', 'active', :at, :at, 1, 0, 0, 0)",
        "INSERT INTO calls (request_id, session_id, call_index, model, arrived_at, status,"
        " prompt_tokens, cached_tokens, output_tokens, stream)"
        " VALUES ('r', 'ses_1', 0, 'm', :at, 'ok', 0, 0, 0, false)",
        "INSERT INTO routing_decisions (request_id, session_id, router, reason, scores,"
        " created_at) VALUES ('r', 'ses_1', 'talaria', 'kv', '{}', :at)",
        "INSERT INTO reservations (reservation_id, session_id, instance, held_bytes,"
        " created_at, expected_return_at, expires_at) VALUES ('v', 'ses_1', 'n', 0, :at, :at, :at)",
        "INSERT INTO hints (session_id, at, kind) VALUES ('ses_1', :at, 'end')",
        "INSERT INTO responses (response_id, tenant_id, session_id, model, created_at,"
        " expires_at, response, input_items) VALUES ('resp', 't', 'ses_1', 'm', :at, :at, '{}',"
        " '[]')",
    )
    try:
        async with engine.begin() as conn:
            for insert in inserts:
                await conn.execute(text(insert), {"at": at})
        await migrate.upgrade_async(db_url)
        async with engine.connect() as conn:
            row = await conn.execute(
                text("SELECT session_key, session_id, parent_session_key FROM sessions")
            )
            assert tuple(row.one()) == ("ses_1", "task-1", "ses_0")
            for table in SESSION_TABLES:
                keys = await conn.execute(text(f"SELECT session_key FROM {table}"))
                assert keys.scalars().all() == ["ses_1"], table
        for table in SESSION_TABLES:
            assert "session_id" not in await _columns(engine, table)
        assert {
            "ix_sessions_tenant_id_session_id": ["tenant_id", "session_id"],
            "ix_sessions_parent_session_key": ["parent_session_key"],
        }.items() <= (await _indexes(engine, "sessions")).items()
        assert await _indexes(engine, "calls") == {
            "ix_calls_session_key_call_index": ["session_key", "call_index"]
        }
        for table in ("reservations", "hints"):
            assert await _indexes(engine, table) == {f"ix_{table}_session_key": ["session_key"]}
        assert await _foreign_keys(engine, "calls") == [
            ("fk_calls_session_key_sessions", ["session_key"], "sessions", ["session_key"])
        ]

        await asyncio.to_thread(migrate.downgrade, db_url, "0007")
        async with engine.connect() as conn:
            row = await conn.execute(
                text("SELECT session_id, external_id, parent_session_id FROM sessions")
            )
            assert tuple(row.one()) == ("ses_1", "task-1", "ses_0")
            for table in SESSION_TABLES:
                keys = await conn.execute(text(f"SELECT session_id FROM {table}"))
                assert keys.scalars().all() == ["ses_1"], table
        assert {
            "ix_sessions_tenant_id_external_id": ["tenant_id", "external_id"],
            "ix_sessions_parent_session_id": ["parent_session_id"],
        }.items() <= (await _indexes(engine, "sessions")).items()
        assert await _indexes(engine, "calls") == {
            "ix_calls_session_id_call_index": ["session_id", "call_index"]
        }
        assert "ix_routing_decisions_session_id" in await _indexes(engine, "routing_decisions")
        assert await _foreign_keys(engine, "calls") == [
            ("fk_calls_session_id_sessions", ["session_id"], "sessions", ["session_id"])
        ]
    finally:
        await engine.dispose()


@pytest.mark.asyncio
async def test_0010_renumbers_repeated_call_indices_and_makes_them_unique(db_url: str) -> None:
    """0010: a session whose calls two replicas numbered alike (0, 1, 1, 2, 2) is renumbered
    0..4 in (call_index, arrived_at, request_id) order; other sessions keep their numbers; a
    repeat is refused from then on."""
    await migrate.upgrade_async(db_url, "0009")
    engine = make_engine(db_url)
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    calls = [("a0", "s", 0), ("a1", "s", 1), ("b1", "s", 1), ("a2", "s", 2), ("b2", "s", 2)]
    calls += [("o0", "o", 0), ("o5", "o", 5)]  # a gap is no repeat: kept
    try:
        async with engine.begin() as conn:
            for key in ("s", "o"):
                await conn.execute(
                    text(
                        "INSERT INTO sessions (session_key, tenant_id, session_id, model, state,"
                        " started_at, last_call_at, calls, prompt_tokens, cached_tokens,"
                        " output_tokens) VALUES (:k, 't', :k, 'm', 'active', :at, :at, 0, 0, 0, 0)"
                    ),
                    {"k": key, "at": t0},
                )
            for n, (rid, key, index) in enumerate(calls):
                await conn.execute(
                    text(
                        "INSERT INTO calls (request_id, session_key, call_index, model,"
                        " arrived_at, status, prompt_tokens, cached_tokens, output_tokens, stream)"
                        " VALUES (:r, :k, :i, 'm', :at, 'ok', 0, 0, 0, false)"
                    ),
                    {"r": rid, "k": key, "i": index, "at": t0 + timedelta(seconds=n)},
                )
        await migrate.upgrade_async(db_url)
        async with engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT request_id, call_index FROM calls ORDER BY session_key, call_index")
            )
            numbered = [tuple(r) for r in rows]
        renumbered = [("a0", 0), ("a1", 1), ("b1", 2), ("a2", 3), ("b2", 4)]
        assert numbered == [("o0", 0), ("o5", 5), *renumbered]
        with pytest.raises(IntegrityError):
            async with engine.begin() as conn:
                await conn.execute(
                    text(
                        "INSERT INTO calls (request_id, session_key, call_index, model,"
                        " arrived_at, status, prompt_tokens, cached_tokens, output_tokens, stream)"
                        " VALUES ('x', 's', 3, 'm', :at, 'ok', 0, 0, 0, false)"
                    ),
                    {"at": t0},
                )
    finally:
        await engine.dispose()


async def _old_key(conn: Any, at: datetime) -> None:
    """Tenant ``t1`` (acme) and its key ``k1`` (``tk-old``), as an older schema holds them."""
    await conn.execute(
        text("INSERT INTO tenants (id, name, created_at) VALUES ('t1', 'acme', :at)"),
        {"at": at},
    )
    await conn.execute(
        text(
            "INSERT INTO api_keys (id, tenant_id, key_hash, prefix, created_at)"
            " VALUES ('k1', 't1', :h, 'tk-old00', :at)"
        ),
        {"h": hash_key("tk-old"), "at": at},
    )


@pytest.mark.asyncio
async def test_0011_gives_existing_keys_the_standard_priority_and_weight_1(db_url: str) -> None:
    """0011: a key created before has priority ``standard`` and weight 1.0 (the columns' server
    defaults), and looks up as such; the downgrade drops both columns and keeps the key."""
    await migrate.upgrade_async(db_url, "0010")
    engine = make_engine(db_url)
    at = datetime(2026, 11, 1, tzinfo=UTC)
    try:
        async with engine.begin() as conn:
            await _old_key(conn, at)
        await migrate.upgrade_async(db_url)
        async with engine.connect() as conn:
            row = (await conn.execute(text("SELECT priority, weight FROM api_keys"))).one()
        assert tuple(row) == ("standard", 1.0)
        caller = await SqlStore(make_sessionmaker(engine)).tenants.caller_for_key("tk-old")
        assert caller == Caller("t1", Share(Priority.STANDARD, 1.0))
        await asyncio.to_thread(migrate.downgrade, db_url, "0010")
        async with engine.connect() as conn:
            columns = await conn.run_sync(
                lambda c: {col["name"] for col in inspect(c).get_columns("api_keys")}
            )
            assert (await conn.execute(text("SELECT count(*) FROM api_keys"))).scalar() == 1
        assert not {"priority", "weight"} & columns
    finally:
        await engine.dispose()


@pytest.mark.asyncio
async def test_0012_leaves_existing_keys_unlimited_and_adds_the_usage_table(db_url: str) -> None:
    """0012: a key created before has no rate limits (``rpm``, ``tpm`` null) and looks up as
    such; a limited key's caller carries its id and limits; ``key_usage`` adds counts per (key,
    minute); the downgrade drops the table and both columns and keeps the keys."""
    await migrate.upgrade_async(db_url, "0011")
    engine = make_engine(db_url)
    at = datetime(2026, 11, 1, tzinfo=UTC)
    try:
        async with engine.begin() as conn:
            await _old_key(conn, at)
        await migrate.upgrade_async(db_url)
        async with engine.connect() as conn:
            row = (await conn.execute(text("SELECT rpm, tpm FROM api_keys"))).one()
        assert tuple(row) == (None, None)
        store = SqlStore(make_sessionmaker(engine))
        assert await store.tenants.caller_for_key("tk-old") == Caller("t1", Share())
        limited = await store.tenants.create_api_key("t1", rpm=60, tpm=1000)
        caller = await store.tenants.caller_for_key(limited)
        assert caller is not None and caller.limits is not None
        assert (caller.limits.rpm, caller.limits.tpm) == (60, 1000)
        assert caller.limits == RateLimits(caller.limits.key_id, 60, 1000)
        minute = datetime(2026, 11, 1, 10, 31, tzinfo=UTC)
        assert await store.usage.add_usage({("k1", minute): (1, 10)}, minute) == {"k1": (1, 10)}
        totals = await store.usage.add_usage({("k1", minute): (2, 5)}, minute)
        assert totals == {"k1": (3, 15)}
        await asyncio.to_thread(migrate.downgrade, db_url, "0011")
        async with engine.connect() as conn:
            columns = await conn.run_sync(
                lambda c: {col["name"] for col in inspect(c).get_columns("api_keys")}
            )
            assert (await conn.execute(text("SELECT count(*) FROM api_keys"))).scalar() == 2
        assert not {"rpm", "tpm"} & columns
        assert "key_usage" not in await _tables(db_url)
    finally:
        await engine.dispose()


@pytest.mark.asyncio
async def test_0013_leaves_existing_keys_and_calls_as_they_were(db_url: str) -> None:
    """0013: a key created before has no prompt normalisation switch of its own (null: the
    server's) and looks up as before; a call recorded before lists no normalised parts; a key
    may say either way, and a call's parts come back as a list; the downgrade drops both
    columns and keeps the rows."""
    await migrate.upgrade_async(db_url, "0012")
    engine = make_engine(db_url)
    at = datetime(2026, 11, 1, tzinfo=UTC)
    try:
        async with engine.begin() as conn:
            await _old_key(conn, at)
            await conn.execute(
                text(
                    "INSERT INTO sessions (session_key, tenant_id, session_id, model, state,"
                    " started_at, last_call_at, calls, prompt_tokens, cached_tokens,"
                    " output_tokens) VALUES ('s1', 't1', 's1', 'm', 'active', :at, :at, 1, 0, 0, 0)"
                ),
                {"at": at},
            )
            await conn.execute(
                text(
                    "INSERT INTO calls (request_id, session_key, call_index, model, arrived_at,"
                    " status, prompt_tokens, cached_tokens, output_tokens, stream)"
                    " VALUES ('r1', 's1', 0, 'm', :at, 'ok', 0, 0, 0, false)"
                ),
                {"at": at},
            )
        await migrate.upgrade_async(db_url)
        async with engine.connect() as conn:
            row = (await conn.execute(text("SELECT normalise_prompts FROM api_keys"))).one()
            assert tuple(row) == (None,)
            assert tuple((await conn.execute(text("SELECT normalised FROM calls"))).one()) == (
                None,
            )
        store = SqlStore(make_sessionmaker(engine))
        assert await store.tenants.caller_for_key("tk-old") == Caller("t1", Share())
        for switch in (True, False):
            key = await store.tenants.create_api_key("t1", normalise_prompts=switch)
            caller = await store.tenants.caller_for_key(key)
            assert caller is not None and caller.normalise_prompts is switch
        listed = await store.tenants.list_api_keys()
        assert [k.normalise_prompts for k in listed] == [None, True, False]
        detail = await store.sessions.get_session("s1")
        assert detail is not None and [c.normalised for c in detail.calls] == [None]
        await asyncio.to_thread(migrate.downgrade, db_url, "0012")
        assert "normalise_prompts" not in await _columns(engine, "api_keys")
        assert "normalised" not in await _columns(engine, "calls")
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM api_keys"))).scalar() == 3
            assert (await conn.execute(text("SELECT count(*) FROM calls"))).scalar() == 1
    finally:
        await engine.dispose()


@pytest.mark.asyncio
async def test_0014_leaves_existing_sessions_without_an_agent(db_url: str) -> None:
    """0014: a session recorded before has no agent kind (null) and reads back as before; a
    new session's record sets it, and a later record without one keeps it; the downgrade drops
    the column and keeps the rows."""
    await migrate.upgrade_async(db_url, "0013")
    engine = make_engine(db_url)
    at = datetime(2026, 11, 1, tzinfo=UTC)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO sessions (session_key, tenant_id, session_id, model, state,"
                    " started_at, last_call_at, calls, prompt_tokens, cached_tokens,"
                    " output_tokens) VALUES ('s1', 't1', 's1', 'm', 'active', :at, :at, 1, 0, 0, 0)"
                ),
                {"at": at},
            )
        await migrate.upgrade_async(db_url)
        store = SqlStore(make_sessionmaker(engine))
        detail = await store.sessions.get_session("s1")
        assert detail is not None and detail.session.agent is None
        await store.write_batch([SessionRecord("s2", "t1", "m", at, at, agent="claude-cli")])
        await store.write_batch([SessionRecord("s2", "t1", "m", at, at)])
        detail = await store.sessions.get_session("s2")
        assert detail is not None and detail.session.agent == "claude-cli"
        await asyncio.to_thread(migrate.downgrade, db_url, "0013")
        assert "agent" not in await _columns(engine, "sessions")
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM sessions"))).scalar() == 2
    finally:
        await engine.dispose()


WIDE_TOKENS = {
    "sessions": ("prompt_tokens", "cached_tokens", "output_tokens"),
    "calls": ("prompt_tokens", "cached_tokens", "output_tokens"),
    "api_keys": ("tpm",),
}
"""The token counts 0015 widens to BIGINT."""
PAST_INT4 = 3_000_000_000
"""A token count past PostgreSQL's int4 (2,147,483,647)."""


async def _column_types(engine: AsyncEngine) -> dict[tuple[str, str], str]:
    """The declared type of each of ``WIDE_TOKENS``' columns, upper case."""

    def read(conn: Connection) -> dict[tuple[str, str], str]:
        found = {}
        for table, names in WIDE_TOKENS.items():
            for column in inspect(conn).get_columns(table):
                if column["name"] in names:
                    found[(table, column["name"])] = str(column["type"]).upper()
        return found

    async with engine.connect() as conn:
        return await conn.run_sync(read)


@pytest.mark.asyncio
async def test_0015_widens_token_counts_and_adds_the_keys_ceiling_and_the_calls_classes(
    db_url: str,
) -> None:
    """0015: every token count is BIGINT (a call of 3e9 prompt tokens and its session's sum
    are stored, where int4 refused them on PostgreSQL); a key created before has no ceiling of
    its own (its priority is its ceiling) and a call recorded before no classes; a new call
    keeps the class asked and the class served. The downgrade narrows the counts back and drops
    the new columns, keeping the rows."""
    await migrate.upgrade_async(db_url, "0014")
    engine = make_engine(db_url)
    at = datetime(2026, 11, 1, tzinfo=UTC)
    try:
        async with engine.begin() as conn:
            await _old_key(conn, at)
            await conn.execute(
                text(
                    "INSERT INTO sessions (session_key, tenant_id, session_id, model, state,"
                    " started_at, last_call_at, calls, prompt_tokens, cached_tokens,"
                    " output_tokens) VALUES ('s1', 't1', 's1', 'm', 'active', :at, :at, 1, 7, 0, 3)"
                ),
                {"at": at},
            )
            await conn.execute(
                text(
                    "INSERT INTO calls (request_id, session_key, call_index, model, arrived_at,"
                    " status, prompt_tokens, cached_tokens, output_tokens, stream)"
                    " VALUES ('r1', 's1', 0, 'm', :at, 'ok', 7, 0, 3, false)"
                ),
                {"at": at},
            )
        assert set((await _column_types(engine)).values()) == {"INTEGER"}
        await migrate.upgrade_async(db_url)
        assert set((await _column_types(engine)).values()) == {"BIGINT"}
        store = SqlStore(make_sessionmaker(engine))
        assert await store.tenants.caller_for_key("tk-old") == Caller("t1", Share())
        big = CallRecord(
            "r2", "s2", 0, "m", "node0", at, at, "ok", prompt_tokens=PAST_INT4,
            cached_tokens=PAST_INT4 - 1, output_tokens=PAST_INT4 + 1,
            priority_asked="interactive", priority_served="batch",
        )  # fmt: skip
        await store.write_batch([SessionRecord("s2", "t1", "m", at, at), big])
        detail = await store.sessions.get_session("s2")
        assert detail is not None and detail.calls == (big,)
        summary = detail.session
        assert (summary.prompt_tokens, summary.cached_tokens, summary.output_tokens) == (
            PAST_INT4, PAST_INT4 - 1, PAST_INT4 + 1,
        )  # fmt: skip
        old = await store.sessions.get_session("s1")
        assert old is not None and old.session.prompt_tokens == 7
        assert [(c.priority_asked, c.priority_served) for c in old.calls] == [(None, None)]
        async with engine.begin() as conn:  # int4 cannot take them back: the downgrade would fail
            await conn.execute(text("DELETE FROM calls WHERE request_id = 'r2'"))
            await conn.execute(text("DELETE FROM sessions WHERE session_key = 's2'"))
        await asyncio.to_thread(migrate.downgrade, db_url, "0014")
        assert set((await _column_types(engine)).values()) == {"INTEGER"}
        assert "max_priority" not in await _columns(engine, "api_keys")
        assert not {"priority_asked", "priority_served"} & set(await _columns(engine, "calls"))
        async with engine.connect() as conn:
            kept = await conn.execute(text("SELECT prompt_tokens, output_tokens FROM calls"))
            assert tuple(kept.one()) == (7, 3)
            assert (await conn.execute(text("SELECT count(*) FROM api_keys"))).scalar() == 1
    finally:
        await engine.dispose()


@pytest.mark.asyncio
async def test_0015_refuses_what_int4_cannot_hold_on_the_way_down(db_url: str) -> None:
    """A token count past int4 fails the downgrade on PostgreSQL (nothing is cut, the schema
    stays at 0015); SQLite's integers are 64-bit whatever their declared type, so there it
    goes down with the value intact."""
    await migrate.upgrade_async(db_url)
    engine = make_engine(db_url)
    at = datetime(2026, 11, 1, tzinfo=UTC)
    try:
        store = SqlStore(make_sessionmaker(engine))
        big = CallRecord("r", "s", 0, "m", None, at, at, "ok", prompt_tokens=PAST_INT4)
        await store.write_batch([SessionRecord("s", "t", "m", at, at), big])
        if engine.dialect.name == "postgresql":
            with pytest.raises(DBAPIError):
                await asyncio.to_thread(migrate.downgrade, db_url, "0014")
            assert await migrate.current_async(db_url) == "0015"
        else:
            await asyncio.to_thread(migrate.downgrade, db_url, "0014")
            assert await migrate.current_async(db_url) == "0014"
        async with engine.connect() as conn:
            value = (await conn.execute(text("SELECT prompt_tokens FROM calls"))).scalar()
        assert value == PAST_INT4
    finally:
        await engine.dispose()


@pytest.mark.asyncio
async def test_migrated_schema_matches_models(db_url: str) -> None:
    await migrate.upgrade_async(db_url)
    engine = make_engine(db_url)
    try:
        async with engine.connect() as conn:
            diff = await conn.run_sync(_diff)
    finally:
        await engine.dispose()
    assert diff == []


@pytest.mark.asyncio
async def test_cli_upgrade_current_downgrade(db_url: str) -> None:
    runner = CliRunner()

    def invoke(*args: str) -> str:
        result = runner.invoke(db_app, list(args))
        assert result.exit_code == 0, result.output
        return result.output

    # The commands run their own event loop, so they run in a thread here, as from a shell.
    assert "current: none" in await asyncio.to_thread(invoke, "current", "--url", db_url)
    assert "revision 0015" in await asyncio.to_thread(invoke, "upgrade", "--url", db_url)
    out = await asyncio.to_thread(invoke, "current", "--url", db_url)
    assert "current: 0015" in out and "head: 0015" in out
    down = await asyncio.to_thread(invoke, "downgrade", "--revision", "base", "--url", db_url)
    assert "revision base" in down


def test_cli_defaults_to_env_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'env.db'}"
    monkeypatch.setenv(store_db.DATABASE_URL_ENV, url)
    result = CliRunner().invoke(db_app, ["upgrade"])
    assert result.exit_code == 0, result.output
    assert migrate.current(url) == "0015"
    assert CliRunner().invoke(db_app, ["downgrade"]).exit_code != 0  # --revision is required


def test_migrations_do_not_depend_on_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    location = migrate.script_location()
    assert (location / "env.py").is_file()
    assert (location / "script.py.mako").is_file()
    url = f"sqlite+aiosqlite:///{tmp_path / 'cwd.db'}"
    migrate.upgrade(url)
    assert migrate.current(url) == "0015"


def test_default_sqlite_url_honours_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "nested" / "data"
    monkeypatch.setenv(store_db.DATA_DIR_ENV, str(target))
    monkeypatch.delenv(store_db.DATABASE_URL_ENV, raising=False)
    assert store_db.default_sqlite_url() == f"sqlite+aiosqlite:///{target / 'talaria.db'}"
    assert target.is_dir()
    assert store_db.default_url() == store_db.default_sqlite_url()
    monkeypatch.setenv(store_db.DATABASE_URL_ENV, "postgresql+asyncpg://u@h/db")
    assert store_db.default_url() == "postgresql+asyncpg://u@h/db"


@pytest.mark.asyncio
async def test_sqlite_pragmas(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'p.db'}")
    try:
        async with engine.connect() as conn:
            mode = (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar()
            sync = (await conn.exec_driver_sql("PRAGMA synchronous")).scalar()
            fks = (await conn.exec_driver_sql("PRAGMA foreign_keys")).scalar()
    finally:
        await engine.dispose()
    assert (mode, sync, fks) == ("wal", 1, 1)


@pytest.mark.asyncio
async def test_replicas_starting_together_migrate_one_after_the_other(db_url: str) -> None:
    """Processes that start at once on one empty database (proxy replicas, each running
    ``talaria db upgrade``) all migrate without error: on PostgreSQL an advisory lock makes
    them take turns (without it the second dies on a duplicate type), on SQLite a file lock."""
    runs = [
        await asyncio.create_subprocess_exec(
            *talaria_command(),
            "db",
            "upgrade",
            "--url",
            db_url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        for _ in range(6)
    ]
    outputs = await asyncio.gather(*(run.communicate() for run in runs))
    for run, (out, _) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, out.decode()
    assert await migrate.current_async(db_url) == migrate.head()
    assert await _tables(db_url) >= TABLES
