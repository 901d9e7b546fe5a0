"""A session's calls are numbered without a repeat in the store (issue 36, finding 6): two
replicas serving one session at once numbered its calls alike (0, 1, 1, 2, 2, ...). The store
refuses a duplicate (session_key, call_index) and renumbers a taken index to the session's
next free one (proxy/store/call_numbers.py), on both backends, for batches one after the other
and for two replicas' batches at once (PostgreSQL: the session row is locked)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncEngine

from talaria.proxy.contract.records import Record
from talaria.proxy.store.db import make_engine, make_sessionmaker
from talaria.proxy.store.migrate import upgrade_async
from talaria.proxy.store.repository import SqlStore
from tests.store.test_store_repository import T0, call, session


async def _indices(store: SqlStore, key: str = "s") -> dict[str, int]:
    detail = await store.sessions.get_session(key)
    assert detail is not None
    return {c.request_id: c.call_index for c in detail.calls}


@pytest.mark.asyncio
async def test_a_taken_index_becomes_the_sessions_next_free_one(store: SqlStore) -> None:
    await store.write_batch([session("s"), call("a0", "s", 0), call("a1", "s", 1)])
    # another replica served the session too, counting from 1 (its own view)
    await store.write_batch([session("s"), call("b1", "s", 1)])
    await store.write_batch([call("b1", "s", 1, output_tokens=30)])  # its finish: re-written
    await store.write_batch([call("a2", "s", 2), call("a2b", "s", 2)])  # alike in one batch
    assert await _indices(store) == {"a0": 0, "a1": 1, "b1": 2, "a2": 3, "a2b": 4}
    detail = await store.sessions.get_session("s")
    assert detail is not None and detail.session.calls == 5
    assert detail.session.output_tokens == 10 * 4 + 30  # the re-write counted once


@pytest.mark.asyncio
async def test_two_replicas_writing_one_session_at_once_never_repeat_an_index(
    engine: AsyncEngine, db_url: str
) -> None:
    """Two writers (two engines: two replicas' connections) write the same session's calls,
    each numbering from its own count, many batches at once. PostgreSQL only: replicas need
    it (docs/deploy-kubernetes.md); a SQLite file has one writer, the proxy's."""
    if db_url.startswith("sqlite"):
        pytest.skip("several replicas write only to PostgreSQL")
    first = SqlStore(make_sessionmaker(engine))
    await first.write_batch([session("s")])
    other_engine = make_engine(db_url)
    try:
        second = SqlStore(make_sessionmaker(other_engine))

        async def replica(store: SqlStore, name: str) -> None:
            for i in range(12):
                at = T0 + timedelta(seconds=i)
                rec = call(f"{name}{i}", "s", i, arrived_at=at)
                await _retrying(store, [session("s", last_call_at=at), rec])

        await asyncio.gather(replica(first, "a"), replica(second, "b"))
    finally:
        await other_engine.dispose()
    indices = await _indices(first)
    assert len(indices) == 24 and sorted(indices.values()) == list(range(24))


async def _retrying(store: SqlStore, records: list[Record]) -> None:
    """As the batched writer does: a transient failure (SQLite's lock) is retried."""
    for _ in range(50):
        try:
            await store.write_batch(records)
            return
        except Exception as exc:
            if store.is_content_error(exc):
                raise
            await asyncio.sleep(0.01)
    raise AssertionError("the write never went through")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty SQLite store migrated to head, copied for each example."""
    path = tmp_path_factory.mktemp("numbers") / "template.db"
    asyncio.run(upgrade_async(f"sqlite+aiosqlite:///{path}"))
    return path


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    plan=st.lists(st.tuples(st.sampled_from("ab"), st.booleans()), min_size=1, max_size=20),
)
def test_any_interleaving_of_two_replicas_numbers_calls_without_a_repeat(
    template: Path, plan: list[tuple[str, bool]]
) -> None:
    """Replica ``a`` and ``b`` each number their calls from 0; their records reach the store
    in any order, in batches of any size (``flush``: the batch ends after this call)."""

    async def run(url: str) -> None:
        engine = make_engine(url)
        store = SqlStore(make_sessionmaker(engine))
        try:
            counts = {"a": 0, "b": 0}
            batch: list[Record] = [session("s")]
            sent: list[str] = []
            for n, (replica, flush) in enumerate(plan):
                rid = f"{replica}{counts[replica]}"
                batch.append(call(rid, "s", counts[replica], arrived_at=T0 + timedelta(seconds=n)))
                sent.append(rid)
                counts[replica] += 1
                if flush:
                    await store.write_batch(batch)
                    batch = []
            await store.write_batch(batch)
            indices = await _indices(store)
        finally:
            await engine.dispose()
        assert sorted(indices) == sorted(sent)
        assert sorted(indices.values()) == list(range(len(sent)))

    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "store.db"
        shutil.copy(template, db)
        asyncio.run(run(f"sqlite+aiosqlite:///{db}"))
