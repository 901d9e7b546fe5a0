"""``SqlStore`` on both backends: write_batch round trips, reads, tenants and API keys."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from talaria.proxy.contract.records import (
    CallRecord,
    DecisionRecord,
    HintRecord,
    InstanceRecord,
    Record,
    ReservationRecord,
    SessionRecord,
)
from talaria.proxy.store.repository import SqlStore
from talaria.proxy.store.sessions import AmbiguousSession
from talaria.proxy.store.tenants import hash_key

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def session(sid: str, at: datetime = T0, **kw: object) -> SessionRecord:
    fields: dict[str, object] = {
        "session_key": sid,
        "tenant_id": "acme",
        "model": "glm",
        "started_at": at,
        "last_call_at": at,
    }
    fields.update(kw)
    return SessionRecord(**fields)  # type: ignore[arg-type]


def call(rid: str, sid: str, index: int, **kw: object) -> CallRecord:
    fields: dict[str, object] = {
        "request_id": rid,
        "session_key": sid,
        "call_index": index,
        "model": "glm",
        "instance": "node-0",
        "arrived_at": T0 + timedelta(seconds=index),
        "finished_at": T0 + timedelta(seconds=index, milliseconds=500),
        "status": "ok",
        "prompt_tokens": 100,
        "cached_tokens": 40,
        "output_tokens": 10,
    }
    fields.update(kw)
    return CallRecord(**fields)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_session_and_calls_round_trip(store: SqlStore) -> None:
    s = session("s1", parent_session_key="s0")
    c0 = call("r0", "s1", 0, queue_s=0.1, prefill_s=0.2, decode_s=0.3, kv_source="new")
    c1 = call("r1", "s1", 1, stream=True, finish_reason="tool_calls", tool_gap_hint_s=2.5)
    await store.write_batch([s, c1, c0])  # calls come back ordered by call_index
    detail = await store.sessions.get_session("s1")
    assert detail is not None
    assert detail.calls == (c0, c1)
    summary = detail.session
    assert (summary.calls, summary.prompt_tokens, summary.cached_tokens) == (2, 200, 80)
    assert summary.output_tokens == 20 and summary.parent_session_key == "s0"
    assert summary.started_at == T0 and summary.state == "active"
    assert await store.sessions.get_session("missing") is None
    assert await store.sessions.get_session("s1", tenant_id="other") is None
    assert await store.sessions.get_session("s1", tenant_id="acme") is not None


@pytest.mark.asyncio
async def test_a_client_id_two_tenants_use_is_not_resolved_to_either(store: SqlStore) -> None:
    """The admin's read by a client's id: with two tenants' sessions of that id, which one
    is meant is not guessed (AmbiguousSession names both); a tenant, by name or id, picks."""
    a = await store.tenants.create_tenant("tenant-a")
    b = await store.tenants.create_tenant("tenant-b")
    later = T0 + timedelta(seconds=1)
    await store.write_batch(
        [
            session("k-a", tenant_id=a, session_id="task-1"),
            session("k-b", at=later, tenant_id=b, session_id="task-1"),
        ]
    )
    with pytest.raises(AmbiguousSession) as raised:
        await store.sessions.get_session("task-1")
    assert raised.value.tenants == [(a, "tenant-a"), (b, "tenant-b")]
    for tenant, key in (("tenant-a", "k-a"), (b, "k-b")):
        picked = await store.sessions.get_session("task-1", tenant_id=tenant)
        assert picked is not None and picked.session.session_key == key
    assert await store.sessions.get_session("k-a") is not None  # a key is never ambiguous
    assert await store.sessions.get_session("k-a", tenant_id="tenant-b") is None


@pytest.mark.asyncio
async def test_call_rewrite_is_idempotent(store: SqlStore) -> None:
    last = call("r1", "s1", 1)
    batch: list[Record] = [session("s1"), call("r0", "s1", 0), last]
    await store.write_batch(batch)
    await store.write_batch(batch)  # a retried batch
    # The same call written again when finished, with more output: counted by the difference.
    await store.write_batch([replace(last, output_tokens=25, status="error", error="boom")])
    detail = await store.sessions.get_session("s1")
    assert detail is not None
    assert [c.request_id for c in detail.calls] == ["r0", "r1"]
    assert detail.calls[1].error == "boom" and detail.calls[1].output_tokens == 25
    s = detail.session
    assert (s.calls, s.prompt_tokens, s.cached_tokens, s.output_tokens) == (2, 200, 80, 35)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("first", "rewrite"),
    [
        (0.75, 0.75),  # written once (and again unchanged, as a retried batch)
        (None, 1.25),  # written before it finished, then with its timings
        (0.0, None),  # a re-write without it clears it, like every other field
    ],
)
async def test_call_slot_wait_round_trips(
    store: SqlStore, first: float | None, rewrite: float | None
) -> None:
    c = call("r0", "s1", 0, queue_s=2.0, slot_wait_s=first)
    await store.write_batch([session("s1"), c])
    detail = await store.sessions.get_session("s1")
    assert detail is not None and detail.calls == (c,)
    again = replace(c, slot_wait_s=rewrite)
    await store.write_batch([again])
    detail = await store.sessions.get_session("s1")
    assert detail is not None and detail.calls == (again,)
    assert detail.calls[0].slot_wait_s == rewrite


@pytest.mark.asyncio
async def test_duplicate_call_within_one_batch(store: SqlStore) -> None:
    c = call("r0", "s1", 0)
    await store.write_batch([session("s1"), c, c])
    detail = await store.sessions.get_session("s1")
    assert detail is not None and detail.session.calls == 1 and len(detail.calls) == 1


@pytest.mark.asyncio
async def test_session_updates_end_and_reopen(store: SqlStore) -> None:
    later = T0 + timedelta(minutes=5)
    await store.write_batch([session("s1"), session("s1", at=T0, last_call_at=later)])
    detail = await store.sessions.get_session("s1")
    assert detail is not None and detail.session.last_call_at == later
    # An older last_call_at never moves it back.
    await store.write_batch([session("s1", state="in_tool")])
    detail = await store.sessions.get_session("s1")
    assert detail is not None
    assert detail.session.last_call_at == later and detail.session.state == "in_tool"
    end = later + timedelta(seconds=1)
    await store.write_batch(
        [session("s1", last_call_at=later, state="ended", ended_at=end, end_reason="client")]
    )
    # A stale in_tool record after the end does not un-end the session...
    await store.write_batch([session("s1", state="in_tool", last_call_at=later)])
    detail = await store.sessions.get_session("s1")
    assert detail is not None
    assert (detail.session.state, detail.session.ended_at, detail.session.end_reason) == (
        "ended",
        end,
        "client",
    )
    # ...but a new call after the end reopens it.
    await store.write_batch([session("s1", last_call_at=end + timedelta(seconds=3))])
    detail = await store.sessions.get_session("s1")
    assert detail is not None
    assert (detail.session.state, detail.session.ended_at, detail.session.end_reason) == (
        "active",
        None,
        None,
    )


@pytest.mark.asyncio
async def test_call_before_its_session_gets_a_placeholder(store: SqlStore) -> None:
    await store.write_batch([call("r0", "s9", 0)])
    detail = await store.sessions.get_session("s9")
    assert detail is not None and detail.session.tenant_id == "unknown"
    assert detail.session.calls == 1
    await store.write_batch([session("s9", at=T0 - timedelta(seconds=5))])
    detail = await store.sessions.get_session("s9")
    assert detail is not None
    assert detail.session.tenant_id == "acme" and detail.session.calls == 1
    assert detail.session.started_at == T0 - timedelta(seconds=5)


@pytest.mark.asyncio
async def test_decisions_hints_reservations(store: SqlStore) -> None:
    scores = {"node-0": {"kv": 1.0, "total": 0.75}, "node-1": {"kv": 0.0, "total": 0.25}}
    d = DecisionRecord("r0", "s1", "session-affinity", "node-0", "kv_hit", scores, T0)
    d_now = DecisionRecord("r1", "s1", "session-affinity", None, "no_instance")
    h = HintRecord("s1", T0 + timedelta(seconds=2), 3.5, tool="bash")
    h_end = HintRecord("s1", T0 + timedelta(seconds=9), None, kind="end")
    r = ReservationRecord(
        "res-1", "s1", "node-0", 1.5e9, T0, T0 + timedelta(seconds=4), T0 + timedelta(seconds=8)
    )
    await store.write_batch([session("s1"), d, h_end, h, r, d_now])
    released = replace(r, released_at=T0 + timedelta(seconds=5), release_reason="returned")
    await store.write_batch([released])
    await store.write_batch([r])  # a late copy of the first write does not un-release it
    detail = await store.sessions.get_session("s1")
    assert detail is not None
    assert detail.decisions[0] == d and detail.decisions[1].instance is None
    created = detail.decisions[1].created_at
    assert created is not None and created.tzinfo is not None
    assert detail.hints == (h, h_end)
    assert detail.reservations == (released,)


@pytest.mark.asyncio
async def test_instance_upsert(store: SqlStore) -> None:
    a = InstanceRecord("node-0", "in-process", None, ["glm"], T0, {"active": "glm"})
    b = InstanceRecord("node-1", "http", "http://10.0.0.2:8000", ["qwen", "glm"], T0)
    await store.write_batch([b, a])
    a2 = replace(a, models=["glm", "qwen"], last_seen_at=T0 + timedelta(1), status={"n": 2})
    await store.write_batch([a2])
    assert await store.cluster.list_instances() == [a2, b]


@pytest.mark.asyncio
async def test_datetimes_come_back_aware_utc(store: SqlStore) -> None:
    plus2 = timezone(timedelta(hours=2))
    local = datetime(2026, 11, 1, 14, 0, tzinfo=plus2)  # == T0
    naive = datetime(2026, 11, 1, 12, 0, 1)  # taken as UTC
    await store.write_batch(
        [session("s1", at=local), call("r0", "s1", 0, arrived_at=naive, finished_at=None)]
    )
    detail = await store.sessions.get_session("s1")
    assert detail is not None
    for value in (
        detail.session.started_at,
        detail.session.last_call_at,
        detail.calls[0].arrived_at,
    ):
        assert value.tzinfo is not None and value.utcoffset() == timedelta(0)
    assert detail.session.started_at == T0
    assert detail.calls[0].arrived_at == T0 + timedelta(seconds=1)
    assert detail.calls[0].finished_at is None
    page = await store.sessions.list_sessions(
        started_after=local, started_before=local + timedelta(1)
    )
    assert [s.session_key for s in page.items] == ["s1"]


@pytest.mark.asyncio
async def test_large_batch(store: SqlStore) -> None:
    records: list[SessionRecord | CallRecord] = []
    for i in range(300):
        records.append(session(f"s{i:03d}", at=T0 + timedelta(seconds=i)))
        records.extend(call(f"r{i:03d}-{j}", f"s{i:03d}", j) for j in range(3))
    await store.write_batch(records)
    await store.write_batch(records)
    page = await store.sessions.list_sessions(limit=1000)
    assert len(page.items) == 300 and page.next_cursor is None
    assert {s.calls for s in page.items} == {3}


@pytest.mark.asyncio
async def test_list_sessions_filters(store: SqlStore) -> None:
    await store.write_batch(
        [
            session("a", at=T0, model="glm"),
            session("b", at=T0 + timedelta(seconds=1), model="qwen", tenant_id="other"),
            session("c", at=T0 + timedelta(seconds=2), state="ended", ended_at=T0),
            session("d", at=T0 + timedelta(seconds=3), model="qwen"),
        ]
    )

    async def ids(**kw: object) -> list[str]:
        page = await store.sessions.list_sessions(**kw)  # type: ignore[arg-type]
        return [s.session_key for s in page.items]

    assert await ids() == ["d", "c", "b", "a"]
    assert await ids(model="qwen") == ["d", "b"]
    assert await ids(tenant_id="other") == ["b"]
    assert await ids(state="ended") == ["c"]
    assert await ids(state="active", model="qwen", tenant_id="acme") == ["d"]
    assert await ids(started_after=T0 + timedelta(seconds=1)) == ["d", "c", "b"]
    assert await ids(started_before=T0 + timedelta(seconds=1)) == ["a"]
    first = await store.sessions.list_sessions(limit=3)
    assert first.next_cursor is not None
    rest = await store.sessions.list_sessions(limit=3, cursor=first.next_cursor)
    assert [s.session_key for s in rest.items] == ["a"] and rest.next_cursor is None


@pytest.mark.asyncio
async def test_list_sessions_rejects_bad_input(store: SqlStore) -> None:
    for bad in ("", "nonsense", "!!!", "WzIsIngiLCJ5Il0"):
        with pytest.raises(ValueError, match="invalid cursor"):
            await store.sessions.list_sessions(cursor=bad)
    with pytest.raises(ValueError, match="limit"):
        await store.sessions.list_sessions(limit=0)


@pytest.mark.asyncio
async def test_tenants_and_api_keys(store: SqlStore) -> None:
    acme = await store.tenants.create_tenant("acme")
    assert await store.tenants.create_tenant("acme") == acme
    other = await store.tenants.create_tenant("other")
    assert other != acme
    assert await store.tenants.count_api_keys() == 0
    key = await store.tenants.create_api_key(acme)
    key2 = await store.tenants.create_api_key(other)
    assert key.startswith("tk-") and len(key) > 40 and key != key2
    assert await store.tenants.tenant_for_key(key) == acme
    assert await store.tenants.tenant_for_key(key2) == other
    assert await store.tenants.tenant_for_key("tk-wrong") is None
    infos = await store.tenants.list_api_keys(acme)
    assert len(infos) == 1 and infos[0].prefix == key[:8] and infos[0].revoked_at is None
    assert key not in repr(infos)  # the plaintext is not stored
    assert await store.tenants.revoke_api_key(infos[0].id)
    assert not await store.tenants.revoke_api_key(infos[0].id)
    assert not await store.tenants.revoke_api_key("no-such-key")
    assert await store.tenants.tenant_for_key(key) is None
    assert await store.tenants.count_api_keys() == 2
    assert await store.tenants.count_api_keys(active_only=True) == 1
    with pytest.raises(ValueError, match="no tenant"):
        await store.tenants.create_api_key("no-such-tenant")
    assert hash_key(key) != key and len(hash_key(key)) == 64


@pytest.mark.asyncio
async def test_replica_heartbeats_and_the_live_set(store: SqlStore) -> None:
    beat = store.cluster.heartbeat
    await beat("r1", "http://a:1", T0, T0, T0)
    await beat("r2", "http://b:2", T0, T0 + timedelta(seconds=4), T0)
    view = await beat("r1", "http://a:1", T0, T0 + timedelta(seconds=5), T0 + timedelta(seconds=3))
    assert view.live == [("r1", "http://a:1"), ("r2", "http://b:2")]  # r1 beat again: one row
    assert view.drained == set()
    await store.cluster.set_drain("node-a", True, T0)
    view = await beat("r3", "http://c:3", T0, T0, T0 + timedelta(seconds=4, milliseconds=1))
    assert view.live == [("r1", "http://a:1")]  # r2 and r3 not heard from since
    assert view.drained == {"node-a"}
    await store.cluster.remove_replica("r1")
    assert (await beat("r2", "http://b:9", T0, T0 + timedelta(seconds=6), T0)).live == [
        ("r2", "http://b:9"),
        ("r3", "http://c:3"),
    ]


@pytest.mark.asyncio
async def test_drains_set_and_clear(store: SqlStore) -> None:
    assert await store.cluster.drained() == set()
    await store.cluster.set_drain("node-a", True, T0)
    await store.cluster.set_drain("node-a", True, T0 + timedelta(seconds=1))  # idempotent
    await store.cluster.set_drain("node-b", True, T0)
    await store.cluster.set_drain("node-b", False, T0)
    assert await store.cluster.drained() == {"node-a"}


@pytest.mark.asyncio
async def test_replicas_end_only_stale_sessions(store: SqlStore) -> None:
    await store.write_batch(
        [
            session("old", last_call_at=T0),
            session("recent", last_call_at=T0 + timedelta(minutes=30)),
            ReservationRecord(
                "res-old", "old", "node-0", 1e9, T0, T0 + timedelta(seconds=5), T0 + timedelta(1)
            ),
            ReservationRecord(
                "res-recent", "recent", "node-0", 1e9, T0, T0 + timedelta(1), T0 + timedelta(1)
            ),
        ]
    )
    cutoff = T0 + timedelta(minutes=20)
    assert await store.sessions.end_open_sessions("stale", T0 + timedelta(hours=1), cutoff) == 1
    old, recent = (
        await store.sessions.get_session("old"),
        await store.sessions.get_session("recent"),
    )
    assert old is not None and recent is not None
    assert (old.session.state, old.session.end_reason) == ("ended", "stale")
    assert old.reservations[0].release_reason == "stale"
    assert recent.session.state == "active" and recent.reservations[0].released_at is None


@pytest.mark.asyncio
async def test_the_list_shows_roots_with_their_families_summed(store: SqlStore) -> None:
    """A root, its child and grandchild are one row, the family summed over all three; a
    session whose parent the store does not hold (an id a client gave) is a root of its own."""
    at = [T0 + timedelta(seconds=s) for s in (0, 10, 20, 30)]
    await store.write_batch(
        [
            session("root", at=at[0], last_call_at=at[1]),
            session("child", at=at[1], parent_session_key="root", last_call_at=at[2]),
            session("grandchild", at=at[2], parent_session_key="child", last_call_at=at[3]),
            session("orphan", at=at[3], parent_session_key="not-a-key"),
            *(call(f"r{i}", key, i) for i, key in enumerate(["root", "child", "grandchild"])),
            call("r3", "root", 3),
        ]
    )
    page = await store.sessions.list_sessions()
    assert [s.session_key for s in page.items] == ["orphan", "root"]
    everything = await store.sessions.list_sessions(roots=False)
    assert len(everything.items) == 4
    families = await store.sessions.families(["root", "orphan"])
    root = families["root"]
    assert (root.sessions, root.calls, root.prompt_tokens, root.cached_tokens) == (3, 4, 400, 160)
    assert root.sct_s == 30.0  # the root's start to the grandchild's last call
    assert families["orphan"].sessions == 1 and families["orphan"].calls == 0
    assert await store.sessions.families([]) == {}
