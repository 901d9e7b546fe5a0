"""New sessions that arrive together spread over the instances that serve their model, even
though every instance's status was read before any of them was routed (a status is read at a
call's admission and cached for ``status_ttl_s``): the proxy counts the calls it routed to an
instance until they end (RuntimePool.with_own_calls). Before, they tied on the same idle
statuses and went where the tie-break sent them: 7 of 8 on one of two real replicas
(bench/replicas_live.py, docs/results.md §15)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from talaria.core.types import CallRequest, GenerationEvent
from talaria.proxy.contract.settings import ProxySettings
from talaria.runtime.instant import InstantRuntime
from tests.integration.server import running_proxy
from tests.support import until

MODEL = "bench-model"
SESSIONS = 16


class HeldRuntime(InstantRuntime):
    """Answers once ``gate`` opens; its status (InstantRuntime's) always the idle one."""

    def __init__(self, name: str, gate: threading.Event) -> None:
        super().__init__((MODEL,), name=name, output_tokens=2)
        self.gate = gate
        self.held = 0

    async def _generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        self.held += 1
        await asyncio.to_thread(self.gate.wait)
        async for event in super()._generate(request):
            yield event


def _call(base_url: str, session: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"task {session}"}]}
    reply = httpx.post(
        base_url + "/v1/chat/completions",
        json=body,
        headers={"X-Talaria-Session-Id": session},
        timeout=60,
    )
    return reply.status_code


def test_new_sessions_arriving_together_spread_evenly(tmp_path: Path) -> None:
    gate = threading.Event()
    runtimes = [HeldRuntime("a", gate), HeldRuntime("b", gate)]
    settings = ProxySettings(database_url=f"sqlite+aiosqlite:///{tmp_path / 'p.db'}")
    with (
        running_proxy(settings, runtimes=list(runtimes)) as proxy,
        ThreadPoolExecutor(SESSIONS) as pool,
    ):
        try:
            replies = [pool.submit(_call, proxy.base_url, f"s{i}") for i in range(SESSIONS)]
            assert until(lambda: sum(r.held for r in runtimes) == SESSIONS, seconds=60)
            held = [r.held for r in runtimes]
        finally:
            gate.set()
        assert [f.result() for f in replies] == [200] * SESSIONS
    assert held == [SESSIONS // 2, SESSIONS // 2]
