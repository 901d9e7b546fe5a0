"""How a relay to an owner replica ends when the owner goes away mid-answer
(proxy/cluster/forward.py, relays.py), over real HTTP to a stand-in owner that streams one
event and a half, then hangs: the stream passes on whole events only and ends with an error
event in the API's format once the owner leaves the live set; the drain ends a relay that
waits for the owner's headers with its 503. The watch's rounds are run by hand
(``Relays.check``), so nothing here waits on a clock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from talaria.proxy.cluster.forward import Cluster
from talaria.proxy.cluster.membership import Membership
from talaria.proxy.cluster.owner import owner
from talaria.proxy.contract.arrival import ARRIVAL_KEY, Arrival
from talaria.proxy.contract.calls import SHUTDOWN
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.dialects.registry import DIALECTS
from talaria.proxy.store.cluster import ClusterView
from tests.integration.server import running_app

FIRST = b'data: {"choices":[{"delta":{"content":"hel"}}]}\n\n'
HALF = b'data: {"choices":[{"del'


def _stand_in_owner(seen: list[dict[str, str]]) -> FastAPI:
    """An owner that answers /healthz, and on any POST streams FIRST and HALF, then hangs
    (with ``?headers=no``: sends nothing at all)."""
    app = FastAPI()
    hang = asyncio.Event()  # never set

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response("{}", media_type="application/json")

    @app.post("/{path:path}")
    async def call(path: str, request: Request) -> Response:
        seen.append(dict(request.headers))
        if request.query_params.get("headers") == "no":  # until the forwarder hangs up
            while (await request.receive())["type"] != "http.disconnect":
                pass

        async def events() -> AsyncIterator[bytes]:
            yield FIRST
            yield HALF
            await hang.wait()

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


class _Store:
    """The store's heartbeat round as Membership makes it; ``live`` is what the next one reads."""

    def __init__(self, live: list[tuple[str, str]]) -> None:
        self.live = live

    async def heartbeat(self, *_: Any) -> ClusterView:
        return ClusterView(list(self.live), set())


def _key_owned_by(name: str) -> str:
    return next(k for k in (f"id|t|s{i}" for i in range(1000)) if owner(k, ["me", name]) == name)


def _request(path: str, query: str = "") -> Request:
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "headers": [(b"content-type", b"application/json"), (b"authorization", b"Bearer k")],
        ARRIVAL_KEY: Arrival(request_id="abc123"),
        "app": SimpleNamespace(state=SimpleNamespace(dialects=DIALECTS)),
    }
    return Request(scope)


@pytest.fixture
def owner_url() -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    with running_app(_stand_in_owner(seen)) as url:
        yield url, seen


async def _cluster(store: _Store) -> Cluster:
    membership = Membership(
        store,  # type: ignore[arg-type]
        "me",
        "http://me",
        heartbeat_s=1.0,
        ttl_s=5.0,
        on_drained=lambda _: None,
    )
    await membership.beat()
    return Cluster(membership, "s" * 32, read_timeout_s=600.0)


@pytest.mark.parametrize(
    ("path", "error_event"),
    [
        ("/v1/chat/completions", b'data: {"error":'),
        ("/v1/messages", b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"'),
        ("/v1/responses", b'event: error\ndata: {"type":"error","code":"replica_unavailable"'),
    ],
)
def test_a_stream_whose_owner_leaves_ends_with_an_error_event_after_whole_events(
    owner_url: tuple[str, list[dict[str, str]]], path: str, error_event: bytes
) -> None:
    url, seen = owner_url
    store = _Store([("owner", url)])

    async def run() -> list[bytes]:
        cluster = await _cluster(store)
        try:
            response = await cluster.forward(_request(path), b"{}", _key_owned_by("owner"))
            assert isinstance(response, StreamingResponse) and response.status_code == 200
            assert response.headers["x-talaria-replica"] == "owner"
            chunks = response.body_iterator
            first = await anext(chunks)  # type: ignore[call-overload]
            waiting = asyncio.ensure_future(anext(chunks))  # type: ignore[call-overload]
            await cluster.relays.check()  # the owner is live and answers /healthz
            assert not waiting.done()
            store.live = []  # its heartbeats stop: it leaves the live set
            await cluster.membership.beat()
            await cluster.relays.check()
            last = await asyncio.wait_for(waiting, 5)
            rest = [chunk async for chunk in chunks]  # type: ignore[union-attr]
            return [first, last, *rest]
        finally:
            await cluster.close()

    first, last, *rest = asyncio.run(run())
    assert first == FIRST  # the half event after it was held back, never sent
    assert rest == []
    assert last.startswith(error_event), last
    doc = json.loads(last.split(b"data: ", 1)[1])
    assert "left the live replicas" in json.dumps(doc)
    (sent,) = seen  # it went out signed
    assert sent["x-talaria-forwarded-by"] == "me" and len(sent["x-talaria-signature"]) == 64


def test_the_drain_ends_a_relay_waiting_for_its_owners_headers(
    owner_url: tuple[str, list[dict[str, str]]],
) -> None:
    url, seen = owner_url

    async def run() -> ApiError:
        cluster = await _cluster(_Store([("owner", url)]))
        try:
            forwarding = asyncio.ensure_future(
                cluster.forward(
                    _request("/v1/chat/completions", "headers=no"), b"{}", _key_owned_by("owner")
                )
            )
            for _ in range(1000):  # until the owner has the request (bounded)
                if seen:
                    break
                await asyncio.sleep(0.005)
            assert cluster.abort_relays() == 1
            with pytest.raises(ApiError) as raised:
                await asyncio.wait_for(forwarding, 5)
            assert cluster.abort_relays() == 0  # it is gone from the relays in flight
            return raised.value
        finally:
            await cluster.close()

    error = asyncio.run(run())
    assert (error.status, error.code, error.message) == (503, "replica_unavailable", SHUTDOWN)
    assert error.headers() == {"Retry-After": "1"}
