"""Prompt normalisation through the real HTTP stack (uvicorn on a loopback port, a real SQLite
file, the embedded simulated runtime 500× faster than real time, which records what it is
asked) with the real ``anthropic`` client: Claude Code's attribution line with a new ``cch`` on
every request neither splits a session nor costs its KV; the engine does not see the line,
unless the switch is off (a key's, or the server's), when it gets the line and the session is
still one thread; an operator's pattern works the same way; any other change is still drift."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import pytest

from talaria.core.calls import content_text
from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock
from talaria.core.types import CallRequest, GenerationEvent
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.runtimes.embedded import InProcessRuntime, build_embedded
from talaria.proxy.store.db import make_engine, make_sessionmaker
from talaria.proxy.store.migrate import upgrade_async
from talaria.proxy.store.repository import SqlStore
from tests.integration.server import running_proxy
from tests.support import admin_get

ADMIN = "admin-secret-token"
MODEL = "glm-4.5-fp8"
HEADER = "x-anthropic-billing-header:"
PROMPT = "You are Claude Code, Anthropic's official CLI for Claude. Be brief. " * 40
ATTRIBUTION = "claude-code-attribution"
TODAY = r"(?m)^Today is \d{4}-\d{2}-\d{2}\.\n?"


class RecordingRuntime(InProcessRuntime):
    """The embedded simulated node, keeping every ``CallRequest`` it is asked to run, by id."""

    asked: dict[str, CallRequest]

    def generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        self.asked[request.request_id] = request
        return super().generate(request)


@dataclass
class Proxy:
    base_url: str
    runtime: RecordingRuntime
    keys: dict[str, str]
    """"plain" (no switch of its own), "on" (``--normalise-prompts``), "off"
    (``--no-normalise-prompts``) → its API key."""
    normalising: bool
    """``TALARIA_NORMALISE_PROMPTS``."""

    def key(self, engine_normalised: bool) -> str:
        """A key whose calls' prompts the engine gets normalised (or not): the plain key where
        the server says so, else the key that says so itself."""
        if engine_normalised == self.normalising:
            return "plain"
        return "on" if engine_normalised else "off"

    def client(self, key: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.base_url, api_key=self.keys[key], max_retries=0)

    def admin(self, path: str) -> Any:
        return admin_get(self.base_url, ADMIN, path)

    def engine_system(self, request_id: str) -> str:
        """The system text the engine got for the call ``request_id``."""
        call = self.runtime.asked[request_id].call
        assert call is not None and call.messages is not None
        first = call.messages[0]
        assert first["role"] == "system"
        return content_text(first["content"])


def _keys(url: str) -> dict[str, str]:
    async def make() -> dict[str, str]:
        await upgrade_async(url)
        engine = make_engine(url)
        tenants = SqlStore(make_sessionmaker(engine)).tenants
        try:
            acme = await tenants.create_tenant("acme")
            return {
                "plain": await tenants.create_api_key(acme),
                "on": await tenants.create_api_key(acme, normalise_prompts=True),
                "off": await tenants.create_api_key(acme, normalise_prompts=False),
            }
        finally:
            await engine.dispose()

    return asyncio.run(make())


@pytest.fixture(scope="module", params=[True, False], ids=["normalising", "not-normalising"])
def proxy(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxy]:
    """A proxy with ``TALARIA_NORMALISE_PROMPTS`` on, then one with it off; both with an
    operator's pattern (a date line)."""
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('normalise') / 'p.db'}"
    keys = _keys(url)
    settings = ProxySettings(
        database_url=url,
        admin_token=ADMIN,
        time_scale=500.0,
        normalise_prompts=request.param,
        prompt_patterns=TODAY,
    )
    clock = LoopClock(settings.time_scale)
    [node] = build_embedded(settings, load_catalog(settings.catalog_path), clock)
    runtime = RecordingRuntime(node.node, clock, settings.status_ttl_s)
    runtime.asked = {}
    with running_proxy(settings, runtimes=[runtime]) as running:
        yield Proxy(running.base_url, runtime, keys, request.param)


def _attribution(rng: random.Random, fingerprint: str) -> str:
    """Claude Code's line with this session's fingerprint and a new ``cch`` and prompt id
    (docs/sources.md §9)."""
    return (
        f"{HEADER} cc_version=2.1.328.{fingerprint}; cc_entrypoint=sdk-cli; "
        f"cch={rng.randrange(16**5):05x}; cc_prompt_id={uuid.UUID(int=rng.getrandbits(128))};"
    )


def _session(
    proxy: Proxy, key: str, system_of: Any, seed: int, calls: int = 4, named: bool = True
) -> list[Any]:
    """``calls`` turns of one conversation (its session id and task drawn from ``seed``), its
    system ``system_of(turn)``; each reply and the next user message appended. Returns the raw
    replies."""
    client = proxy.client(key)
    rng = random.Random(seed)
    sid = str(uuid.UUID(int=rng.getrandbits(128)))
    headers = {"X-Claude-Code-Session-Id": sid} if named else {}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"fix the failing test {rng.getrandbits(64):x} " * 20}
    ]
    replies = []
    for turn in range(calls):
        raw = client.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=64,
            system=system_of(turn),
            messages=messages,
            extra_headers=headers,
        )
        replies.append(raw)
        reply = raw.parse()
        messages += [
            {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
            {"role": "user", "content": f"go on ({turn})"},
        ]
    return replies


def _claude_code_system(seed: int) -> Any:
    rng = random.Random(seed)
    fingerprint = f"{rng.randrange(16**3):03x}"
    return lambda turn: [
        {"type": "text", "text": _attribution(rng, fingerprint)},
        {"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}},
    ]


def _calls(proxy: Proxy, replies: list[Any]) -> list[dict[str, Any]]:
    """The admin API's records of these calls (one session), in order."""
    key = replies[0].headers["x-talaria-session-key"]
    assert all(r.headers["x-talaria-session-key"] == key for r in replies)
    detail = proxy.admin(f"/admin/sessions/{key}")
    assert detail["session"]["calls"] == len(replies) and detail["children"] == []
    return sorted(detail["calls"], key=lambda c: c["call_index"])


@pytest.mark.parametrize("named", [True, False], ids=["named", "implicit"])
def test_a_new_cch_every_request_neither_splits_the_session_nor_costs_its_kv(
    proxy: Proxy, named: bool
) -> None:
    """Normalisation on for the calls (the server's, or the key's where the server has it
    off): the engine never sees the line, every call continues the one thread, and every call
    after the first reuses the KV."""
    seed = 1 if named else 2
    system = _claude_code_system(seed)
    replies = _session(proxy, proxy.key(engine_normalised=True), system, seed, named=named)
    hows = [r.headers["x-talaria-session-how"] for r in replies]
    assert hows == ["new", "continued", "continued", "continued"]
    cached = [r.parse().usage.cache_read_input_tokens for r in replies]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached
    assert [proxy.engine_system(r.headers["x-request-id"]) for r in replies] == [PROMPT] * 4
    calls = _calls(proxy, replies)
    assert [(c["how"], c["thread"], c["drift_at"]) for c in calls] == [
        ("new", 0, None), *[("continued", 0, None)] * 3
    ]  # fmt: skip
    assert all(c["normalised"] == [ATTRIBUTION] for c in calls)


def test_with_the_switch_off_the_engine_gets_the_line_and_the_session_one_thread(
    proxy: Proxy,
) -> None:
    """Normalisation off for the calls (the key's, or the server's): the engine gets each
    call's own line, so none of its KV is reusable (the line changed at message 0), but the
    session is found by the normalised text: one thread, every call a continuation."""
    system = _claude_code_system(3)
    replies = _session(proxy, proxy.key(engine_normalised=False), system, 3)
    assert [r.headers["x-talaria-session-how"] for r in replies] == ["new"] + ["continued"] * 3
    seen = [proxy.engine_system(r.headers["x-request-id"]) for r in replies]
    assert all(s.startswith(HEADER) and s.endswith(PROMPT) for s in seen)
    assert len(set(seen)) == 4  # a new cch every request
    assert [r.parse().usage.cache_read_input_tokens for r in replies] == [0] * 4
    calls = _calls(proxy, replies)
    assert [(c["how"], c["thread"]) for c in calls] == [("new", 0), *[("continued", 0)] * 3]
    assert all(c["normalised"] == [ATTRIBUTION] for c in calls)


def test_an_operators_pattern_takes_its_line_out_too(proxy: Proxy) -> None:
    """``TALARIA_PROMPT_PATTERNS``: a date line that changes every call."""

    def system(turn: int) -> str:
        return f"Today is 2026-12-{turn + 1:02d}.\n{PROMPT}"

    replies = _session(proxy, proxy.key(engine_normalised=True), system, 5, calls=3)
    assert [r.headers["x-talaria-session-how"] for r in replies] == ["new"] + ["continued"] * 2
    assert [proxy.engine_system(r.headers["x-request-id"]) for r in replies] == [PROMPT] * 3
    assert all(r.parse().usage.cache_read_input_tokens > 0 for r in replies[1:])
    assert all(c["normalised"] == ["operator-1"] for c in _calls(proxy, replies))


def test_any_other_change_of_the_system_prompt_is_still_drift(proxy: Proxy) -> None:
    """A named session's third call also changes a line no row covers: ``drifted`` at message
    0, the attribution line taken out all the same."""
    rng = random.Random(4)

    def system(turn: int) -> str:
        clock = "12:00" if turn < 2 else "12:01"
        return f"{_attribution(rng, 'abc')}\nTime: {clock}.\n{PROMPT}"

    replies = _session(proxy, proxy.key(engine_normalised=True), system, 4, calls=3)
    hows = [r.headers["x-talaria-session-how"] for r in replies]
    assert hows == ["new", "continued", "drifted"]
    calls = _calls(proxy, replies)
    assert (calls[2]["drift_at"], calls[2]["thread"]) == (0, 0)
    assert all(c["normalised"] == [ATTRIBUTION] for c in calls)
    seen = [proxy.engine_system(r.headers["x-request-id"]) for r in replies]
    assert all(s.startswith("Time: ") and s.endswith(PROMPT) for s in seen)
