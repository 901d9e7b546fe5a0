"""What a session owns ends with it, through the HTTP stack (issue 46, item 1): the proxy app in
front of runtime servers over HTTP (uvicorn on loopback sockets, in this test's own event loop,
so the nodes can be read between calls without a thread in the way).

Before: the proxy posted ``/v1/runtime/sessions/ses_x/<n>/end`` (and ``hint``, ``moved``) with
the thread key unencoded, and the runtime's ``{session_key}`` route takes no ``/``: every one
was a 404, so retired threads and every thread of an ended session stayed on the node.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from talaria.core.protocol_sessions import ENDS_ROUTE
from talaria.proxy.callpath.gateway import Gateway
from talaria.proxy.callpath.keeper import SessionKeeper
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.edge.app import create_app
from talaria.runtime.config import load_node_config
from talaria.runtime.scheduling.node import NodeScheduler
from talaria.runtime.server import create_runtime_app
from tests.integration.server import StatusLog

MODEL = "glm-4.5-fp8"
ADMIN = "admin-secret-token"
NODE_TOML = """
[node]
name = "{name}"
policy = "talaria"
quantum_s = 30
time_scale = 500

[[model]]
name = "glm-4.5-fp8"
engine = "sim"
"""


class _Server(uvicorn.Server):
    """uvicorn that says when it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await super().startup(sockets)
        self.listening.set()


class RefuseEnds:
    """ASGI middleware: while ``refusing``, the runtime answers the ends route 503 (a runtime
    the proxy cannot reach, as the proxy sees it)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.refusing = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.refusing and scope["type"] == "http" and scope["path"] == ENDS_ROUTE:
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, receive, send)


@dataclass
class Runtime:
    """One runtime server: its URL, its app (the node), what it answered, its refusal."""

    url: str
    app: FastAPI
    log: StatusLog
    refuse: RefuseEnds

    @property
    def node(self) -> NodeScheduler:
        node: NodeScheduler = self.app.state.runtime.node
        return node

    def answers(self, suffix: str) -> list[int]:
        """The statuses of the POSTs whose path ends with ``suffix``."""
        return [status for method, path, status in self.log.seen if path.endswith(suffix)]


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """``app`` on a free loopback port, in this event loop; its base URL."""
    server = _Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    task = asyncio.create_task(server.serve())
    listening = asyncio.create_task(server.listening.wait())
    await asyncio.wait([task, listening], return_when=asyncio.FIRST_COMPLETED)
    if not server.listening.is_set():
        raise RuntimeError("the server did not start")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@asynccontextmanager
async def stack(tmp: Path, runtimes: int, **proxy: Any) -> AsyncIterator[tuple[Any, list[Runtime]]]:
    """``runtimes`` runtime servers and a proxy in front of them: (a client of the proxy,
    the runtimes)."""
    async with AsyncExitStack() as exits:
        served: list[Runtime] = []
        for i in range(runtimes):
            path = tmp / f"rt{i}.toml"
            path.write_text(NODE_TOML.format(name=f"rt{i}"))
            app = create_runtime_app(load_node_config(path))
            log = StatusLog(app)
            refuse = RefuseEnds(log)
            url = await exits.enter_async_context(serving(refuse))
            served.append(Runtime(url, app, log, refuse))
        settings = ProxySettings(
            database_url=f"sqlite+aiosqlite:///{tmp}/proxy.db",
            admin_token=ADMIN,
            runtimes=[r.url for r in served],
            status_ttl_s=0.0,
            **proxy,
        )
        proxy_app = create_app(settings)
        await exits.enter_async_context(proxy_app.router.lifespan_context(proxy_app))
        client = await exits.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=proxy_app), base_url="http://p")
        )
        client.app = proxy_app  # type: ignore[attr-defined]
        yield client, served


def gateway_of(client: httpx.AsyncClient) -> Gateway:
    gateway: Gateway = client.app.state.talaria.gateway  # type: ignore[attr-defined]
    return gateway


def keeper_of(client: httpx.AsyncClient) -> SessionKeeper:
    keeper: SessionKeeper = client.app.state.talaria.keeper  # type: ignore[attr-defined]
    return keeper


async def chat(client: httpx.AsyncClient, session: str, messages: list[dict[str, Any]]) -> str:
    """One call of ``session``; the reply's text."""
    answer = await client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": messages, "max_tokens": 8},
        headers={"x-session-id": session},
    )
    assert answer.status_code == 200, answer.text
    text: str = answer.json()["choices"][0]["message"]["content"]
    return text


def conversation(n: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"conversation {n}: fix test_{n}.py " * 8}]


async def settle(work: Callable[[], Awaitable[object]] | None = None) -> None:
    """Let the tasks the keeper spawned (a retired thread's end) run to their end."""
    if work is not None:
        await work()
    for _ in range(20):
        await asyncio.sleep(0)


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(main())  # type: ignore[arg-type]


def test_three_hundred_conversations_leave_the_thread_cap_and_the_end_leaves_none(
    tmp_path: Path,
) -> None:
    """One session opening 300 conversations keeps at most 64 threads + 1 being retired on the
    node (was: all 300, every retired thread's end a 404); its end leaves nothing there
    (entry, KV, reservation, fair-queue account)."""

    async def main() -> None:
        async with stack(tmp_path, 1) as (client, (runtime,)):
            for n in range(300):
                await chat(client, "many", conversation(n))
            await settle()
            kept = runtime.node.session_keys()
            assert 64 <= len(kept) <= 65, len(kept)
            assert runtime.answers("/end") == [] and set(runtime.answers(ENDS_ROUTE)) == {200}
            assert len(runtime.answers(ENDS_ROUTE)) >= 300 - 65
            ended = await client.post("/v1/sessions/many/end")
            assert ended.json() == {"session_id": "many", "ended": True}
            assert runtime.node.session_keys() == set()
            async with httpx.AsyncClient() as direct:
                status = (await direct.get(runtime.url + "/v1/runtime/status")).json()
            assert status["sessions"] == {} and status["reserved"] == {}

    run(main)


def test_a_threads_hint_and_move_reach_the_node_and_its_end_every_node_it_ran_on(
    tmp_path: Path,
) -> None:
    """Thread 1 of a session: its hint reaches the node that runs it (was a 404), its move
    (its instance drained) the node it left, and the session's end both nodes."""

    async def main() -> None:
        async with stack(tmp_path, 2) as (client, runtimes):
            await chat(client, "s", conversation(0))
            side = conversation(1)
            reply = await chat(client, "s", side)  # a new conversation: thread 1
            state = next(iter(keeper_of(client).sessions))
            thread = state.threads[1]
            first = next(r for r in runtimes if r.node.name == thread.last_instance)
            hinted = await client.post("/v1/sessions/s/hints", json={"expected_s": 5.0})
            assert hinted.status_code == 200
            key = state.runtime_key(1)
            assert first.answers(f"/{key}/hint") == [200]
            drained = await client.post(
                f"/admin/instances/{first.node.name}/drain",
                headers={"authorization": f"Bearer {ADMIN}"},
            )
            assert drained.status_code == 200
            side += [{"role": "assistant", "content": reply}, {"role": "user", "content": "go"}]
            await chat(client, "s", side)  # thread 1 goes on, on the other node
            assert thread.last_instance != first.node.name
            assert first.answers(f"/{key}/moved") == [200]
            assert all(key in r.node.session_keys() for r in runtimes)
            ended = await client.post("/v1/sessions/s/end")
            assert ended.json()["ended"] is True
            assert [r.node.session_keys() for r in runtimes] == [set(), set()]

    run(main)


def test_a_runtime_that_refused_the_end_learns_it_at_the_next_sweep(tmp_path: Path) -> None:
    """The end of a session whose node does not take it (unreachable, as the proxy sees it) is
    kept, and sent again at the keeper's sweep once the node answers."""

    async def main() -> None:
        async with stack(tmp_path, 1) as (client, (runtime,)):
            for n in range(3):
                await chat(client, "gone", conversation(n))
            assert len(runtime.node.session_keys()) == 3
            runtime.refuse.refusing = True
            await client.post("/v1/sessions/gone/end")
            gateway = gateway_of(client)
            await settle(gateway.sweep_once)  # still refused: kept
            assert len(runtime.node.session_keys()) == 3
            runtime.refuse.refusing = False
            await settle(gateway.sweep_once)
            assert runtime.node.session_keys() == set()

    run(main)
