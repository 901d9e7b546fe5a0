"""A load of agent sessions over real HTTP, mixed APIs, streaming and not, that remembers which
calls the proxy *acknowledged*: a 200 whose body arrived whole (a JSON body, or a stream up to
its end marker: ``[DONE]``, ``message_stop``, ``response.completed`` or ``.incomplete``).
Those are the calls that must have their ``ok`` row in the store, whatever happens to the
proxy afterwards.

Calls refused with 503 / 429 are retried after ``Retry-After`` (capped); a connection error
ends the session (the proxy is gone)."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

APIS = ("chat", "messages", "responses")
END_MARKERS = {  # the last event of a whole stream (a Responses stream cut by its token limit
    # ends "incomplete")
    "chat": ("data: [DONE]",),
    "messages": ("event: message_stop",),
    "responses": ("event: response.completed", "event: response.incomplete"),
}
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}
MAX_RETRY_WAIT_S = 2.0


@dataclass
class LoadResult:
    """What a load saw: the acknowledged calls, the HTTP statuses, the disconnects."""

    acked: dict[str, tuple[str, bool]] = field(default_factory=dict)
    """request id → (api, stream) of every acknowledged call."""
    statuses: Counter[int] = field(default_factory=Counter)
    disconnects: int = 0
    sessions_done: int = 0


def _body(api: str, model: str, turn: int, stream: bool) -> dict[str, Any]:
    history: list[dict[str, Any]] = []
    for i in range(turn + 1):
        history.append({"role": "user", "content": f"step {i}: run the tests and fix what fails"})
        if i < turn:
            history.append({"role": "assistant", "content": f"done step {i}"})
    if api == "chat":
        return {"model": model, "messages": history, "max_tokens": 16, "stream": stream}
    if api == "messages":
        return {"model": model, "messages": history, "max_tokens": 16, "stream": stream}
    return {
        "model": model,
        "input": history,
        "max_output_tokens": 16,
        "store": False,
        "stream": stream,
    }


async def _one_call(
    client: httpx.AsyncClient, api: str, body: dict[str, Any], session: str
) -> tuple[int, str | None, bool]:
    """(status, request id, acknowledged)."""
    headers = {"X-Talaria-Session-Id": session, "Authorization": "Bearer any"}
    if api == "messages":
        headers["anthropic-version"] = "2023-06-01"
    async with client.stream("POST", PATHS[api], json=body, headers=headers) as response:
        text = (await response.aread()).decode()
        request_id = response.headers.get("x-request-id")
        if response.status_code != 200:
            return response.status_code, request_id, False
        if body.get("stream"):
            return 200, request_id, any(marker in text for marker in END_MARKERS[api])
        json.loads(text)  # a whole JSON body
        return 200, request_id, True


async def run_load(
    base_url: str,
    model: str,
    *,
    sessions: int,
    calls_per_session: int = 3,
    concurrency: int = 32,
    seed: int = 0,
    on_ack: Callable[[int], None] | None = None,
    keep_going: Callable[[], bool] | None = None,
) -> LoadResult:
    """``sessions`` sessions (more while ``keep_going()``), ``concurrency`` at a time, each of
    ``calls_per_session`` calls on one API (chat, messages, responses; streaming or not, drawn
    with ``seed``). ``on_ack(n)`` is told the number of acknowledged calls after each one."""
    result = LoadResult()
    rng = random.Random(seed)
    plan = iter(range(10**9))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:

        async def session(index: int) -> None:
            api = APIS[index % len(APIS)]
            stream = rng.random() < 0.5
            name = f"load-{seed}-{index}"
            for turn in range(calls_per_session):
                body = _body(api, model, turn, stream)
                while True:
                    try:
                        status, request_id, acked = await _one_call(client, api, body, name)
                    except httpx.TransportError:
                        result.disconnects += 1
                        return
                    result.statuses[status] += 1
                    if status in (429, 503):
                        await asyncio.sleep(min(MAX_RETRY_WAIT_S, 0.2 + rng.random() * 0.5))
                        continue
                    break
                if acked and request_id is not None:
                    result.acked[request_id] = (api, stream)
                    if on_ack is not None:
                        on_ack(len(result.acked))
                elif status == 200:
                    return  # a stream cut short: the proxy went away mid-answer
            result.sessions_done += 1

        async def worker() -> None:
            while True:
                index = next(plan)
                if index >= sessions and (keep_going is None or not keep_going()):
                    return
                await session(index)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return result
