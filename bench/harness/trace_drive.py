"""A trace's sessions driven closed-loop through live proxies, one agent per session (what
bench/cluster_live.py and bench/placement_live.py send): each session starts at its offset and
sleeps each tool gap, both divided by the time scale; each call appends a user message of
letters and spaces sized so that the conversation is the trace's prompt tokens, and posts the
OpenAI chat body with aiohttp and msgspec (the ``openai`` client cost 11-14 ms of CPU a call,
most of a core of the two: bench/cluster_live.py's docstring)."""

from __future__ import annotations

import asyncio
import math
import random
import string
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from talaria.core.calls import MESSAGE_OVERHEAD_TOKENS, message_tokens
from talaria.core.http_edge import CLIENT_KEEP_ALIVE_S
from talaria.core.trace import SessionTrace
from talaria.proxy.cluster.owner import owner, route_key, weight

LETTERS = string.ascii_lowercase + " " * 5  # words of ~5 letters on average


def _log(message: str) -> None:
    print(f"[drive {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Words:
    """Letters and spaces to cut user messages from: a seeded pool of 1 MiB, made before the
    drive; a cut is a slice (a copy), so the driver spends next to no CPU on text."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self._pool = "".join(rng.choices(LETTERS, k=1 << 20))

    def message(self, rng: random.Random, tokens: int) -> dict[str, str]:
        """A user message whose estimate by the proxy (4 bytes a token plus the message
        overhead, core/calls.py) is ``tokens``, at least 1 + the overhead."""
        n = 4 * max(1, tokens - MESSAGE_OVERHEAD_TOKENS)
        pool = self._pool * (n // len(self._pool) + 1) if n > len(self._pool) else self._pool
        start = rng.randrange(len(pool) - n + 1)
        return {"role": "user", "content": pool[start : start + n]}


@dataclass
class SessionResult:
    session_id: str
    model: str
    calls: int = 0
    failures: list[str] = field(default_factory=list)
    forwarded: int = 0
    sct_wall_s: float = math.nan
    call_wall_s: float = 0.0
    """Wall seconds spent waiting for answers."""
    tool_s: float = 0.0
    """The trace's tool gaps this session slept (simulated seconds): SCT less the answers'
    wait less this is how late the driver's sleeps woke up."""


def ingress_index(urls: list[str], session_id: str) -> int:
    """The replica an ingress that hashes the session header sends ``session_id`` to
    (``--balancer ingress``): a consistent hash of the header's value over the replicas'
    positions, independent of the replicas' own owner choice, as nginx's would be."""
    return max(range(len(urls)), key=lambda i: weight(session_id, f"ingress-{i}"))


def owner_index(urls: list[str], session_id: str) -> int:
    """The replica that owns ``session_id`` (proxy/cluster/owner.py: replicas are named by
    their TALARIA_REPLICA_URL; the tenant of an open proxy is ``local``)."""
    key = route_key("local", session_id, None)
    assert key is not None  # an explicit session id always has one
    return urls.index(owner(key, urls))


async def drive(
    urls: list[str],
    sessions: list[SessionTrace],
    words: Words,
    seed: int,
    scale: float,
    balancer: str = "round-robin",
    ignore_eos: bool = False,
    log: Callable[[str], None] = _log,
    headers_of: Callable[[SessionTrace], dict[str, str]] | None = None,
) -> list[SessionResult]:
    """One agent per session, closed loop; call i of a session goes to replica i mod R (with
    ``balancer`` "owner": always to the session's owner, so nothing is forwarded; "ingress":
    always to the replica a consistent hash of its session header picks).

    Each call's user message makes the conversation's estimated size the trace's prompt tokens
    (the replies the engines gave count as they are), so that the simulated engines see the
    trace's prompts; a trace call that truncates the context (new tokens = prompt tokens)
    starts the conversation over. ``ignore_eos``: each reply runs to the trace's output tokens
    (vLLM's extension), not to the simulated answer's own end. ``log`` hears the progress.
    ``headers_of``: a session's own headers on each of its calls (its tenant's key, its
    class)."""
    http = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=600),
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=CLIENT_KEEP_ALIVE_S),
        headers={"authorization": "Bearer bench", "content-type": "application/json"},
    )
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    done = 0

    async def agent(session: SessionTrace) -> SessionResult:
        nonlocal done
        result = SessionResult(session.session_id, session.model)
        await asyncio.sleep(max(0.0, t0 + session.start_s / scale - loop.time()))
        started = loop.time()
        rng = random.Random(f"{seed}/{session.session_id}")
        home = (
            owner_index(urls, session.session_id)
            if balancer == "owner"
            else ingress_index(urls, session.session_id)
            if balancer == "ingress"
            else None
        )
        messages: list[Any] = []
        size = 0  # the proxy's estimate of ``messages``, in tokens
        last = len(session.calls) - 1
        for i, call in enumerate(session.calls):
            if i > 0 and call.new_tokens == call.prompt_tokens:
                messages, size = [], 0  # the trace truncated the context: history rewritten
            messages.append(words.message(rng, call.prompt_tokens - size))
            size += message_tokens(messages[-1])
            headers = {"X-Talaria-Session-Id": session.session_id}
            if headers_of is not None:
                headers.update(headers_of(session))
            if i == last:
                headers["X-Talaria-Session-Final"] = "true"
            url = urls[i % len(urls) if home is None else home]
            body = {"model": session.model, "messages": messages, "max_tokens": call.output_tokens}
            if ignore_eos:
                body["ignore_eos"] = True
            sent = loop.time()
            result.calls += 1
            try:
                content, forwarded = await _chat(http, url, body, headers)
                result.forwarded += forwarded
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                result.failures.append(f"call {i} via {url}: {exc!r}"[:300])
                content = "(failed)"
            result.call_wall_s += loop.time() - sent
            messages.append({"role": "assistant", "content": content})
            size += message_tokens(messages[-1])
            if call.tool_gap_s is not None and i < last:
                await asyncio.sleep(call.tool_gap_s / scale)  # the tool runs
                result.tool_s += call.tool_gap_s
        result.sct_wall_s = loop.time() - started
        done += 1
        if done % max(1, len(sessions) // 10) == 0 or done == len(sessions):
            log(f"  {done}/{len(sessions)} sessions done")
        return result

    try:
        return list(await asyncio.gather(*(agent(s) for s in sessions)))
    finally:
        await http.close()


async def _chat(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[str, bool]:
    """POST a chat completion: (the reply's text, whether another replica answered it);
    ``ValueError`` for an answer that is not a 200 with a choice."""
    async with http.post(
        url + "/v1/chat/completions", data=msgspec.json.encode(body), headers=headers
    ) as answer:
        raw = await answer.read()
        if answer.status != 200:
            raise ValueError(f"HTTP {answer.status}: {raw[:200]!r}")
        reply = msgspec.json.decode(raw)
        content = reply["choices"][0]["message"].get("content") or ""
        return content, "x-talaria-replica" in answer.headers
