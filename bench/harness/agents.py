"""Agent sessions that stream, call after call, until told to stop, and retry what fails.

Each session speaks one API, always streaming: OpenAI chat completions, Anthropic Messages or
OpenAI Responses (``store: false``, the conversation resent in ``input``). A session is named
by one of the headers the agents send (``X-Talaria-Session-Id``; Claude Code's
``X-Claude-Code-Session-Id``; Codex's ``session-id``), or by none (an *implicit* session,
known to the proxy by its conversation). After a whole answer the session appends the reply
it streamed and a new user message, waits a short seeded think time, and calls again. A call
that fails (an HTTP error, a broken connection, a stream that ends with an ``error`` event or
without its end event) is sent again, unchanged, after its ``Retry-After`` (capped) or a
short pause, as agents do, so the session goes on.

A call is *acknowledged* when its 200 stream reached its end event (``[DONE]``,
``message_stop``, ``response.completed`` / ``.incomplete``) with no ``error`` event before
it: with durable acknowledgement the proxy sends that event only after the call's records
are committed (docs/operations.md, "What is durable, and when").

Every attempt is kept as an :class:`Attempt` (monotonic times, outcome, request id, the
session key and instance the proxy named in its headers, the replica nginx chose), and a
:class:`Progress` lets another thread wait for a condition on them."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

APIS = ("chat", "messages", "responses")
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}
SESSION_HEADERS = ("x-talaria-session-id", "x-claude-code-session-id", "session-id")
"""The session headers of Talaria's own clients, Claude Code and Codex (docs/agents.md)."""
SYSTEM = "You are a coding agent working in a repository."
MAX_RETRY_WAIT_S = 2.0
RETRY_PAUSE_S = 0.3
"""The pause before resending a call that failed without a ``Retry-After``."""
OK = "ok"


@dataclass(frozen=True)
class Attempt:
    """One HTTP call of a session: ``outcome`` is ``ok`` (acknowledged), ``http <status>``,
    ``connection`` (no answer, or the answer broke off), ``stream error`` (an ``error``
    event) or ``stream cut`` (a 200 stream that ended without its end event)."""

    session: str
    api: str
    sent_at: float
    ended_at: float
    outcome: str
    request_id: str | None = None
    session_key: str | None = None
    instance: str | None = None
    upstream: str | None = None
    retry_after: float | None = None
    detail: str = ""

    @property
    def acked(self) -> bool:
        """The call was acknowledged (its stream reached its end event)."""
        return self.outcome == OK


@dataclass
class Agent:
    """One session's conversation and how it names itself (``header``; None: implicit)."""

    name: str
    api: str
    header: str | None
    model: str
    max_tokens: int
    history: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.history:
            self.history = [{"role": "user", "content": f"Fix the failing test in {self.name}."}]

    def headers(self) -> dict[str, str]:
        """The call's headers: its session header, and the Messages API's version."""
        out = {"authorization": "Bearer any"}
        if self.header is not None:
            out[self.header] = self.name
        if self.api == "messages":
            out["anthropic-version"] = "2023-06-01"
        return out

    def body(self) -> dict[str, Any]:
        """The next call's body (the same until :meth:`answered`, so a retry resends it)."""
        history = [dict(m) for m in self.history]
        if self.api == "chat":
            messages = [{"role": "system", "content": SYSTEM}, *history]
            return {
                "model": self.model,
                "messages": messages,
                "max_tokens": self.max_tokens,
                "stream": True,
            }
        if self.api == "messages":
            return {
                "model": self.model,
                "system": SYSTEM,
                "messages": history,
                "max_tokens": self.max_tokens,
                "stream": True,
            }
        return {
            "model": self.model,
            "instructions": SYSTEM,
            "input": history,
            "max_output_tokens": self.max_tokens,
            "store": False,
            "stream": True,
        }

    def answered(self, reply: str) -> None:
        """The call was acknowledged with ``reply``: the conversation goes on."""
        turn = len(self.history) // 2 + 1
        self.history.append({"role": "assistant", "content": reply})
        self.history.append({"role": "user", "content": f"ran the tests ({turn}); go on"})


class StreamReader:
    """Reads one API's SSE lines: the reply's text, whether the end event came, whether an
    ``error`` event did."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.text: list[str] = []
        self.ended = False
        self.error: str | None = None
        self._event: str | None = None

    def feed(self, line: str) -> None:
        """One line of the stream."""
        if line.startswith("event:"):
            self._event = line[6:].strip()
            return
        if not line.startswith("data:"):
            if not line:
                self._event = None
            return
        data = line[5:].strip()
        if self.api == "chat":
            if data == "[DONE]":
                self.ended = self.error is None
                return
            doc = json.loads(data)
            if "error" in doc:
                self.error = json.dumps(doc["error"])[:300]
                return
            for choice in doc.get("choices") or ():
                self.text.append((choice.get("delta") or {}).get("content") or "")
            return
        event, doc = self._event, json.loads(data)
        if event == "error" or event == "response.failed":
            self.error = data[:300]
        elif self.api == "messages":
            if event == "content_block_delta" and doc["delta"].get("type") == "text_delta":
                self.text.append(doc["delta"]["text"])
            elif event == "message_stop":
                self.ended = self.error is None
        elif event == "response.output_text.delta":
            self.text.append(doc["delta"])
        elif event in ("response.completed", "response.incomplete"):
            self.ended = self.error is None

    @property
    def reply(self) -> str:
        """The text streamed so far."""
        return "".join(self.text)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


async def call_once(
    client: httpx.AsyncClient, agent: Agent, progress: Progress | None = None
) -> tuple[Attempt, str]:
    """Send the agent's next call once: (the attempt, the reply's text). ``progress`` is told
    when its 200 stream opens (:meth:`Progress.opened`)."""
    sent = time.monotonic()
    meta: dict[str, Any] = {}
    try:
        async with client.stream(
            "POST", PATHS[agent.api], json=agent.body(), headers=agent.headers()
        ) as response:
            meta = {
                "request_id": response.headers.get("x-request-id"),
                "session_key": response.headers.get("x-talaria-session-key"),
                "instance": response.headers.get("x-talaria-instance"),
                "upstream": response.headers.get("x-upstream"),
            }
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return Attempt(
                    agent.name,
                    agent.api,
                    sent,
                    time.monotonic(),
                    f"http {response.status_code}",
                    retry_after=_retry_after(response),
                    detail=text[:300],
                    **meta,
                ), ""
            reader = StreamReader(agent.api)
            if progress is not None:
                progress.opened(agent.name, meta["upstream"], meta["instance"])
            async for line in response.aiter_lines():
                reader.feed(line)
    except httpx.TransportError as exc:
        return Attempt(
            agent.name, agent.api, sent, time.monotonic(), "connection", detail=repr(exc), **meta
        ), ""
    outcome = OK if reader.ended else "stream error" if reader.error else "stream cut"
    detail = reader.error or ""
    return Attempt(
        agent.name, agent.api, sent, time.monotonic(), outcome, detail=detail, **meta
    ), reader.reply


class Progress:
    """The attempts so far, shared between the load's thread and the one that watches it."""

    def __init__(self) -> None:
        self.attempts: list[Attempt] = []
        self.streaming: dict[str, tuple[str | None, str | None]] = {}
        """Sessions whose 200 stream is open now: (the replica nginx chose, the instance)."""
        self._changed = threading.Condition()

    def opened(self, session: str, upstream: str | None, instance: str | None) -> None:
        """``session``'s call is streaming its answer (from ``upstream``, ``instance``)."""
        with self._changed:
            self.streaming[session] = (upstream, instance)
            self._changed.notify_all()

    def add(self, attempt: Attempt) -> None:
        """Keep ``attempt`` (its stream, if any, is over) and wake the waiters."""
        with self._changed:
            self.streaming.pop(attempt.session, None)
            self.attempts.append(attempt)
            self._changed.notify_all()

    def wait_streaming(
        self, where: Callable[[str | None, str | None], bool], timeout_s: float
    ) -> bool:
        """Until a stream is open whose (replica, instance) ``where`` accepts, or ``timeout_s``
        passed: whether one is."""
        with self._changed:
            return self._changed.wait_for(
                lambda: any(where(*w) for w in self.streaming.values()), timeout=timeout_s
            )

    def snapshot(self) -> list[Attempt]:
        """The attempts so far."""
        with self._changed:
            return list(self.attempts)

    def wait_for(self, done: Callable[[list[Attempt]], bool], timeout_s: float) -> bool:
        """Until ``done(attempts)`` holds (checked at each new attempt), or ``timeout_s``
        passed: whether it holds."""
        with self._changed:
            return self._changed.wait_for(lambda: done(self.attempts), timeout=timeout_s)


async def drive(
    base_url: str,
    agents: list[Agent],
    progress: Progress,
    stop: threading.Event,
    *,
    seed: int = 0,
    think_s: tuple[float, float] = (0.1, 0.4),
    read_timeout_s: float = 120.0,
) -> None:
    """Run every agent until ``stop`` is set: call, and after an acknowledged call think a
    seeded ``think_s`` (uniform) before the next; resend a failed call after its
    ``Retry-After`` (at most ``MAX_RETRY_WAIT_S``) or ``RETRY_PAUSE_S`` (jittered)."""
    timeout = httpx.Timeout(read_timeout_s, connect=5.0, pool=60.0)
    limits = httpx.Limits(max_connections=len(agents) + 4, max_keepalive_connections=len(agents))
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits) as client:

        async def run(index: int, agent: Agent) -> None:
            rng = random.Random(f"{seed}-{index}")
            await asyncio.sleep(rng.uniform(0, think_s[1]))  # spread the first calls
            while not stop.is_set():
                attempt, reply = await call_once(client, agent, progress)
                progress.add(attempt)
                if attempt.acked:
                    agent.answered(reply)
                    pause = rng.uniform(*think_s)
                elif attempt.retry_after is not None:
                    pause = min(attempt.retry_after, MAX_RETRY_WAIT_S)
                else:
                    pause = RETRY_PAUSE_S * rng.uniform(0.5, 1.5)
                await asyncio.sleep(pause)

        await asyncio.gather(*(run(i, a) for i, a in enumerate(agents)))


def make_agents(sessions: int, implicit: int, model: str, max_tokens: int, tag: str) -> list[Agent]:
    """``sessions`` named sessions, their APIs and headers in turn, then ``implicit``
    sessions without a header (APIs in turn)."""
    agents = []
    for i in range(sessions):
        header = SESSION_HEADERS[(i // len(APIS)) % len(SESSION_HEADERS)]
        agents.append(Agent(f"chaos-{tag}-n{i}", APIS[i % len(APIS)], header, model, max_tokens))
    for i in range(implicit):
        agents.append(Agent(f"chaos-{tag}-i{i}", APIS[i % len(APIS)], None, model, max_tokens))
    return agents
