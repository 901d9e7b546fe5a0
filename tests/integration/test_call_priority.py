"""A call's terms in the node's fair queue, through the real HTTP stack (uvicorn on a loopback
port, a real SQLite file, a runtime that records what it is asked): the runtime gets the
tenant as a digest (never its id), the key's weight, the call's class, its deadline in clock
seconds and the agent's kind, on every API; ``X-Talaria-Priority`` may lower the key's class,
never raise it past the key's ceiling (its own class, or ``talaria keys create
--max-priority``), and the admin API shows the class each call asked and the class it was
served in; a bad priority or deadline is a 400 in the API's own envelope, and nothing runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from talaria.cli.keys import keys_app
from talaria.core.types import CallRequest, GenerationEvent, Priority
from talaria.proxy.callpath.runner import tenant_digest
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.store.db import make_engine, make_sessionmaker
from talaria.proxy.store.repository import SqlStore
from talaria.runtime.instant import InstantRuntime
from tests.integration.server import running_proxy

MODEL = "glm-4.5-fp8"
TIME_SCALE = 4.0
ASK = "Summarise the plan."
ROUTES = {  # path → a call's body
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": ASK}]},
    "/v1/completions": {"model": MODEL, "prompt": ASK, "max_tokens": 8},
    "/v1/messages": {
        "model": MODEL,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": ASK}],
    },
    "/v1/responses": {"model": MODEL, "input": ASK, "store": False},
}
PRIORITY = "X-Talaria-Priority"
DEADLINE = "X-Talaria-Deadline-S"


class RecordingRuntime(InstantRuntime):
    """An ``InstantRuntime`` that keeps every ``CallRequest`` it is asked to run, by id."""

    def __init__(self) -> None:
        super().__init__((MODEL,), output_tokens=4)
        self.asked: dict[str, CallRequest] = {}

    def generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        self.asked[request.request_id] = request
        return super().generate(request)


@dataclass
class Proxy:
    base_url: str
    runtime: RecordingRuntime
    keys: dict[str, tuple[str, str]]
    """"bulk" (a key made ``--priority batch --weight 2``), "granted" (one of the same tenant
    made with ``--max-priority interactive`` too) and "ide" (a plain key) → (tenant id, API
    key)."""


ADMIN = "admin-token-for-the-class-tests"


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('priority') / 'p.db'}"
    options = ["--tenant", "bulk", "--priority", "batch", "--weight", "2", "--url", url]
    made: dict[str, str] = {}
    for name, more in (("bulk", []), ("granted", ["--max-priority", "interactive"])):
        created = CliRunner().invoke(keys_app, ["create", *options, *more])
        assert created.exit_code == 0, created.output
        made[name] = created.output.strip()

    async def keys() -> dict[str, tuple[str, str]]:
        engine = make_engine(url)
        tenants = SqlStore(make_sessionmaker(engine)).tenants
        try:
            bulk = await tenants.create_tenant("bulk")  # the CLI made it: its id
            ide = await tenants.create_tenant("ide")
            return {
                "bulk": (bulk, made["bulk"]),
                "granted": (bulk, made["granted"]),
                "ide": (ide, await tenants.create_api_key(ide)),
            }
        finally:
            await engine.dispose()

    runtime = RecordingRuntime()
    settings = ProxySettings(database_url=url, time_scale=TIME_SCALE, admin_token=ADMIN)
    with running_proxy(settings, runtimes=[runtime]) as running:
        yield Proxy(running.base_url, runtime, asyncio.run(keys()))


def _post(proxy: Proxy, path: str, key: str, **headers: str) -> httpx.Response:
    sent = {"authorization": f"Bearer {key}", "anthropic-version": "2023-06-01", **headers}
    return httpx.post(proxy.base_url + path, json=ROUTES[path], headers=sent, timeout=30)


def _asked(proxy: Proxy, path: str, key: str, **headers: str) -> CallRequest:
    """What the runtime was asked for the call ``path`` answered (200)."""
    reply = _post(proxy, path, key, **headers)
    assert reply.status_code == 200, reply.text
    return proxy.runtime.asked[reply.headers["x-request-id"]]


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_the_runtime_gets_the_agents_kind(proxy: Proxy, path: str) -> None:
    """The node learns tool gaps per agent kind: its ``User-Agent``'s product name, else
    where the session id came from."""
    key = proxy.keys["ide"][1]
    claude = _asked(proxy, path, key, **{"user-agent": "claude-cli/2.1.328 (external, cli)"})
    assert claude.agent == "claude-cli"
    assert _asked(proxy, path, key).agent == "python-httpx"  # httpx's own
    named = _asked(proxy, path, key, **{"user-agent": "", "x-session-id": f"s-{path}"})
    assert named.agent == "x-session-id"
    assert _asked(proxy, path, key, **{"user-agent": "(odd)"}).agent == "implicit"


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_the_runtime_gets_the_tenant_digest_weight_class_and_deadline(
    proxy: Proxy, path: str
) -> None:
    tenant, key = proxy.keys["granted"]
    asked = _asked(proxy, path, key, **{PRIORITY: "Interactive", DEADLINE: "2.5"})
    assert asked.priority is Priority.INTERACTIVE
    assert asked.deadline_s == 2.5 * TIME_SCALE  # wall seconds → the clock's
    assert asked.tenant_weight == 2.0
    assert asked.tenant == asked.cache_salt == tenant_digest(tenant)
    assert tenant not in asked.tenant and "bulk" not in asked.tenant
    other = _asked(proxy, path, proxy.keys["ide"][1])
    assert other.tenant != asked.tenant and other.deadline_s is None


@pytest.mark.parametrize(
    ("who", "headers", "expected"),
    [
        ("bulk", {}, Priority.BATCH),  # the key's default
        ("bulk", {PRIORITY: "standard"}, Priority.BATCH),  # a header may not raise it
        ("bulk", {PRIORITY: "INTERACTIVE"}, Priority.BATCH),
        ("granted", {}, Priority.BATCH),  # --max-priority is a ceiling, not the default
        ("granted", {PRIORITY: "standard"}, Priority.STANDARD),  # up to the ceiling
        ("granted", {PRIORITY: "INTERACTIVE"}, Priority.INTERACTIVE),
        ("ide", {}, Priority.STANDARD),  # a plain key: standard
        ("ide", {PRIORITY: "batch"}, Priority.BATCH),  # a header may lower it
        ("ide", {PRIORITY: "interactive"}, Priority.STANDARD),
    ],
)
def test_the_header_lowers_the_keys_class_and_never_raises_it_past_its_ceiling(
    proxy: Proxy, who: str, headers: dict[str, str], expected: Priority
) -> None:
    for path in ROUTES:
        asked = _asked(proxy, path, proxy.keys[who][1], **headers)
        assert asked.priority is expected, path
        assert asked.tenant_weight == (1.0 if who == "ide" else 2.0)


@pytest.mark.parametrize(
    ("who", "header", "served"),
    [
        ("bulk", "interactive", "batch"),
        ("bulk", None, "batch"),
        ("granted", "interactive", "interactive"),
        ("ide", "batch", "batch"),
    ],
)
def test_the_admin_api_shows_the_class_asked_and_the_class_served(
    proxy: Proxy, who: str, header: str | None, served: str
) -> None:
    """Each call's record keeps the class its header asked (None: no header) and the class
    it was served in, on every API."""
    for path in ROUTES:
        session = f"asked-{who}-{header}-{path}"
        headers = {"X-Talaria-Session-Id": session, **({PRIORITY: header} if header else {})}
        reply = _post(proxy, path, proxy.keys[who][1], **headers)
        assert reply.status_code == 200, reply.text
        detail = httpx.get(
            f"{proxy.base_url}/admin/sessions/{session}",
            headers={"authorization": f"Bearer {ADMIN}"},
            timeout=30,
        )
        assert detail.status_code == 200, detail.text
        [call] = detail.json()["calls"]
        assert (call["priority_asked"], call["priority_served"]) == (header, served), path


BAD = [
    (PRIORITY, "urgent"),
    (PRIORITY, "high"),
    (DEADLINE, "0"),
    (DEADLINE, "-3"),
    (DEADLINE, "soon"),
    (DEADLINE, "nan"),
    (DEADLINE, "inf"),
    (DEADLINE, "1e400"),
    (DEADLINE, "1e9"),  # past a week
]


def _refused(reply: httpx.Response, path: str, header: str) -> None:
    """A 400 in the route's envelope whose message names ``header``."""
    assert reply.status_code == 400, reply.text
    doc: dict[str, Any] = reply.json()
    if path == "/v1/messages":  # Anthropic's envelope
        assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
    else:  # OpenAI's
        assert doc["error"]["type"] == "invalid_request_error"
        assert (doc["error"]["code"], doc["error"]["param"]) == ("invalid_value", header)
    assert header in doc["error"]["message"]


@pytest.mark.parametrize("path", sorted(ROUTES))
@pytest.mark.parametrize(("header", "value"), BAD, ids=[f"{h}={v}" for h, v in BAD])
def test_a_bad_priority_or_deadline_is_a_400_in_the_apis_envelope_and_nothing_runs(
    proxy: Proxy, path: str, header: str, value: str
) -> None:
    before = proxy.runtime.calls
    for session in ({}, {"X-Talaria-Session-Id": "named-by-header"}):  # placed early or not
        _refused(
            _post(proxy, path, proxy.keys["ide"][1], **session, **{header: value}), path, header
        )
    assert proxy.runtime.calls == before


def test_open_mode_calls_are_standard_with_weight_1(tmp_path: Path) -> None:
    """Open mode's caller is ``standard`` with a ``standard`` ceiling: a header may lower
    its class, not raise it."""
    runtime = RecordingRuntime()
    settings = ProxySettings(database_url=f"sqlite+aiosqlite:///{tmp_path}/open.db")
    with running_proxy(settings, runtimes=[runtime]) as running:
        reply = httpx.post(
            running.v1 + "/chat/completions", json=ROUTES["/v1/chat/completions"], timeout=30
        )
        assert reply.status_code == 200, reply.text
        late = httpx.post(
            running.v1 + "/chat/completions",
            json=ROUTES["/v1/chat/completions"],
            headers={PRIORITY: "batch", DEADLINE: "60"},
            timeout=30,
        )
        assert late.status_code == 200, late.text
        raised = httpx.post(
            running.v1 + "/chat/completions",
            json=ROUTES["/v1/chat/completions"],
            headers={PRIORITY: "interactive"},
            timeout=30,
        )
        assert raised.status_code == 200, raised.text
    asked = runtime.asked[reply.headers["x-request-id"]]
    assert (asked.priority, asked.tenant_weight, asked.deadline_s) == (Priority.STANDARD, 1.0, None)
    assert asked.tenant == tenant_digest("local")
    later = runtime.asked[late.headers["x-request-id"]]
    assert (later.priority, later.deadline_s) == (Priority.BATCH, 60.0)
    assert runtime.asked[raised.headers["x-request-id"]].priority is Priority.STANDARD
