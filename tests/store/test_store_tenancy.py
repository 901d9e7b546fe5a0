"""Records are never upserted across tenants (proxy/store/batch.py), on SQLite and PostgreSQL:
a record whose key (a response id, a request id, a session key) names another tenant's row
is dropped, in a later batch or in the same one, and the row stays its owner's."""

from __future__ import annotations

from datetime import timedelta

import pytest

from talaria.proxy.contract.records import Record
from talaria.proxy.dialects.responses.tables import ResponseRecord
from talaria.proxy.store.repository import SqlStore
from tests.store.test_store_repository import T0, call, session
from tests.support import responses


def response(tenant: str, text: str) -> ResponseRecord:
    return ResponseRecord(
        response_id="resp_1",
        tenant_id=tenant,
        session_key=f"ses-{tenant}",
        model="glm",
        created_at=T0,
        expires_at=T0 + timedelta(days=7),
        response={"id": "resp_1", "output_text": text},
        input_items=[{"id": "msg_1", "content": text}],
        size_bytes=100 + len(text),
    )


@pytest.mark.asyncio
@pytest.mark.parametrize("together", [False, True], ids=["later-batch", "same-batch"])
async def test_another_tenants_response_id_never_replaces_the_stored_response(
    store: SqlStore, together: bool
) -> None:
    a, b = response("tenant-a", "A's answer"), response("tenant-b", "B's answer")
    if together:
        await store.write_batch([a, b])
    else:
        await store.write_batch([a])
        await store.write_batch([b])
    kept = await responses(store).get_response("tenant-a", "resp_1", T0)
    assert kept is not None and kept.response["output_text"] == "A's answer"
    assert kept.input_items == [{"id": "msg_1", "content": "A's answer"}]
    assert await responses(store).get_response("tenant-b", "resp_1", T0) is None
    # the owner itself still rewrites its own row
    await store.write_batch([response("tenant-a", "A's second answer")])
    again = await responses(store).get_response("tenant-a", "resp_1", T0)
    assert again is not None and again.response["output_text"] == "A's second answer"


@pytest.mark.asyncio
@pytest.mark.parametrize("together", [False, True], ids=["later-batch", "same-batch"])
async def test_another_sessions_request_id_never_moves_the_call(
    store: SqlStore, together: bool
) -> None:
    a_call = call("r0", "ses-a", 0)
    b_call = call("r0", "ses-b", 0, prompt_tokens=7, cached_tokens=0, output_tokens=3)
    first: list[Record] = [session("ses-a", tenant_id="tenant-a"), a_call]
    second: list[Record] = [session("ses-b", tenant_id="tenant-b"), b_call]
    if together:
        await store.write_batch([*first, *second])
    else:
        await store.write_batch(first)
        await store.write_batch(second)
    a = await store.sessions.get_session("ses-a", tenant_id="tenant-a")
    assert a is not None and a.calls == (a_call,)
    assert (a.session.calls, a.session.prompt_tokens, a.session.output_tokens) == (1, 100, 10)
    b = await store.sessions.get_session("ses-b", tenant_id="tenant-b")
    assert b is not None and b.calls == () and b.session.calls == 0
    assert (b.session.prompt_tokens, b.session.output_tokens) == (0, 0)


@pytest.mark.asyncio
async def test_another_tenants_record_never_takes_a_session_over(store: SqlStore) -> None:
    await store.write_batch([session("ses-a", tenant_id="tenant-a", model="glm")])
    later = T0 + timedelta(seconds=9)
    await store.write_batch(
        [session("ses-a", tenant_id="tenant-b", model="qwen", last_call_at=later)]
    )
    assert await store.sessions.get_session("ses-a", tenant_id="tenant-b") is None
    a = await store.sessions.get_session("ses-a", tenant_id="tenant-a")
    assert a is not None
    assert (a.session.model, a.session.last_call_at) == ("glm", T0)
