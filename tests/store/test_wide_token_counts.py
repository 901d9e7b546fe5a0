"""Token counts past 2^31 through the real HTTP stack, on both backends (issue 46, a Low): the
proxy app (over ASGI, its store migrated by its own start) records what its runtime reports,
and a session's sums, past PostgreSQL's int4 (2,147,483,647): before migration 0015 the
session's row could not take 3e9 there, and the admin API did not show it."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import replace

import httpx
import pytest

from talaria.core.types import CallRequest, Finished, GenerationEvent
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.edge.app import create_app
from talaria.runtime.instant import InstantRuntime

MODEL = "glm-4.5-fp8"
PER_CALL = 1_500_000_000
"""Prompt tokens the runtime reports for each call: two of them pass int4 in their sum."""
ADMIN = "admin-token-for-the-wide-counts"


class LargeUsage(InstantRuntime):
    """An ``InstantRuntime`` whose calls report ``PER_CALL`` prompt tokens, all cached but the
    first call's, as a long-lived session's sums would grow."""

    def generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        return self._large(super().generate(request), request.call_index)

    async def _large(
        self, events: AsyncGenerator[GenerationEvent, None], index: int
    ) -> AsyncGenerator[GenerationEvent, None]:
        async for event in events:
            if isinstance(event, Finished):
                cached = PER_CALL - 1 if index else 0
                event = Finished(
                    replace(event.result, prompt_tokens=PER_CALL, cached_tokens=cached)
                )
            yield event


@pytest.mark.asyncio
async def test_a_sessions_token_sums_past_int4_are_recorded_and_shown(db_url: str) -> None:
    settings = ProxySettings(database_url=db_url, admin_token=ADMIN)
    app = create_app(settings, runtimes=[LargeUsage((MODEL,), output_tokens=4)])
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            for n in range(2):
                reply = await client.post(
                    "/v1/chat/completions",
                    headers={"x-talaria-session-id": "long-lived"},
                    json={"model": MODEL, "messages": [{"role": "user", "content": f"step {n}"}]},
                )
                assert reply.status_code == 200, reply.text
                assert reply.json()["usage"]["prompt_tokens"] == PER_CALL
            detail = await client.get(
                "/admin/sessions/long-lived", headers={"authorization": f"Bearer {ADMIN}"}
            )
    assert detail.status_code == 200, detail.text
    doc = detail.json()
    assert [c["prompt_tokens"] for c in doc["calls"]] == [PER_CALL, PER_CALL]
    session = doc["session"]
    assert (session["prompt_tokens"], session["cached_tokens"]) == (2 * PER_CALL, PER_CALL - 1)
    assert session["output_tokens"] == 8 and session["calls"] == 2
