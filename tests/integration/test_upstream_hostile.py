"""Upstreams at arm's length (issue 46, item 5), through the real HTTP stack: a runtime
(in this process, over HTTP) whose ``engine = "openai"`` models front a hostile server
(tests/integration/hostile_upstream.py), a proxy in front of it, real clients.

- Placement of an upstream over HTTP names only servers under the operator's prefixes, never
  shadows a catalog model with another, and its errors never echo what the server sent.
- An endless model list, an endless line, a 64 MiB reply for ``max_tokens: 8`` and a
  comments-only stream each fail (or are cut) within the bounds the node sets (small here),
  the runtime's Python memory (tracemalloc, in-process) within 50 MB of where it was, and
  the next call is served.
- Usage is checked against what was sent; no tenant reads another's prefix through
  ``cached_tokens`` (salted, or hidden where the server takes no salt).

Every test here fails on the code before issue 46's item 5.
"""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.store.db import make_engine, make_sessionmaker
from talaria.proxy.store.repository import SqlStore
from talaria.runtime.config import load_node_config
from talaria.runtime.placement_rules import PlacementRules
from talaria.runtime.server import create_runtime_app
from tests.fake_upstream import FakeUpstream, fake_upstream_thread
from tests.integration.hostile_upstream import SECRET, HostileUpstream
from tests.integration.server import running_app, running_proxy

MEMORY_BOUND_BYTES = 50_000_000
BOUNDS = "line_max_bytes = 65536\ncall_timeout_s = 1.0\n"
NODE_TOML = """
[node]
name = "arm-length"
quantum_s = 5
"""
MODEL = """
[[model]]
name = "{name}"
engine = "openai"
url = "{url}"
served_model = "{served}"
{extra}
"""
HELLO = [{"role": "user", "content": "hello"}]


@dataclass
class Setup:
    hostile: FakeUpstream
    unlisted: FakeUpstream
    runtime: str
    a: openai.OpenAI
    b: openai.OpenAI

    @property
    def models(self) -> str:
        return self.runtime + "/v1/runtime/models"


def _node_toml(url: str) -> str:
    models = [
        ("good", "fake-model", ""),
        ("salted", "fake-model", 'cache_isolation = "salt"'),
        *((m, m, BOUNDS) for m in ("endless-line", "big-reply", "comments", "lying-usage")),
    ]
    return NODE_TOML + "".join(
        MODEL.format(name=n, url=url, served=s, extra=extra) for n, s, extra in models
    )


def _two_keys(url: str) -> tuple[str, str]:
    async def create() -> tuple[str, str]:
        from talaria.proxy.store.migrate import upgrade_async

        await upgrade_async(url)
        engine = make_engine(url)
        store = SqlStore(make_sessionmaker(engine))
        try:
            a = await store.tenants.create_api_key(await store.tenants.create_tenant("a"))
            b = await store.tenants.create_api_key(await store.tenants.create_tenant("b"))
        finally:
            await engine.dispose()
        return a, b

    return asyncio.run(create())


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("arm")
    with (
        fake_upstream_thread(HostileUpstream, max_model_len=8192) as hostile,
        fake_upstream_thread() as unlisted,
    ):
        config = tmp / "node.toml"
        config.write_text(_node_toml(hostile.url))
        rules = PlacementRules(upstream_urls=(hostile.url,))
        app = create_runtime_app(load_node_config(config), rules=rules)
        with running_app(app) as runtime:
            url = f"sqlite+aiosqlite:///{tmp}/p.db"
            key_a, key_b = _two_keys(url)
            settings = ProxySettings(database_url=url, runtimes=[runtime])
            with running_proxy(settings) as proxy:

                def client(key: str) -> openai.OpenAI:
                    return openai.OpenAI(base_url=proxy.v1, api_key=key, max_retries=0)

                yield Setup(hostile, unlisted, runtime, client(key_a), client(key_b))


def _placed(setup: Setup, entry: dict[str, Any]) -> httpx.Response:
    return httpx.post(setup.models, json=entry, timeout=60)


def test_only_allowed_upstreams_are_placed_and_no_catalog_name_is_taken(setup: Setup) -> None:
    hostile = setup.hostile.url
    port = hostile.rsplit(":", 1)[1]
    for url in (
        setup.unlisted.url,  # another server: it would get every tenant's prompts
        f"http://localhost:{port}",  # another spelling of the host
        f"{hostile}.evil.example",  # a longer port or host
        f"http://user@127.0.0.1:{port}",
        f"{hostile}/v1/../leak",
    ):
        answer = _placed(setup, {"name": "mine", "engine": "openai", "url": url})
        assert answer.status_code == 400, (url, answer.text)
        assert "allowed upstream URL prefix" in answer.json()["error"]
    assert setup.unlisted.log == []  # nothing was fetched from a URL not allowed
    # a catalog model's name for another model: every tenant calling it would reach this one
    shadow = {"name": "glm-4.5-fp8", "engine": "openai", "url": hostile,
              "served_model": "fake-model"}  # fmt: skip
    answer = _placed(setup, shadow)
    assert answer.status_code == 400, answer.text
    assert "catalog" in answer.json()["error"]
    placed = _placed(setup, {"name": "mine", "engine": "openai", "url": hostile + "/v1",
                             "served_model": "fake-model"})  # fmt: skip
    assert placed.status_code == 201, placed.text


@pytest.mark.parametrize("root", ["leak", "leak500"])
def test_a_placement_error_names_the_fault_not_the_servers_answer(setup: Setup, root: str) -> None:
    entry = {"name": f"from-{root}", "engine": "openai", "url": f"{setup.hostile.url}/{root}"}
    answer = _placed(setup, entry)
    assert answer.status_code == 500, answer.text
    error = answer.json()["error"]
    assert "SECRET" not in error and SECRET not in answer.text
    assert ("not a model list" if root == "leak" else "answered 500") in error


@dataclass(frozen=True)
class Hostile:
    """One hostile exchange: what it does, and what its answer must say."""

    run: Callable[[Setup], Any]
    expect: Callable[[Any], None]


def _place_endless(setup: Setup) -> Any:
    entry = {"name": "endless-list", "engine": "openai", "url": f"{setup.hostile.url}/endless"}
    return _placed(setup, entry)


def _expect_list_bound(answer: Any) -> None:
    assert answer.status_code == 500, answer.text
    assert "models_max_bytes" in answer.json()["error"]


def _chat(model: str, **kwargs: Any) -> Callable[[Setup], Any]:
    def run(setup: Setup) -> Any:
        try:
            return setup.a.chat.completions.create(model=model, messages=HELLO, **kwargs)
        except openai.APIStatusError as exc:
            return exc

    return run


def _failed_at(bound: str) -> Callable[[Any], None]:
    def expect(answer: Any) -> None:
        assert isinstance(answer, openai.APIStatusError), answer
        assert answer.status_code == 503 and bound in answer.message, answer.message

    return expect


def _cut_at_eight(answer: Any) -> None:
    assert not isinstance(answer, Exception), answer
    choice = answer.choices[0]
    assert choice.finish_reason == "length"
    assert answer.usage.completion_tokens <= 8
    assert len((choice.message.content or "").encode()) <= 8 * 256  # usage.py MAX_TOKEN_BYTES


HOSTILE_CASES = {
    "endless-model-list": Hostile(_place_endless, _expect_list_bound),
    "endless-line": Hostile(_chat("endless-line"), _failed_at("line_max_bytes")),
    "comments-only": Hostile(_chat("comments"), _failed_at("call_timeout_s")),
    "64-MiB-for-8-tokens": Hostile(_chat("big-reply", max_tokens=8), _cut_at_eight),
}


@pytest.mark.parametrize("case", list(HOSTILE_CASES))
def test_a_hostile_upstream_fails_only_its_own_call_within_its_bounds(
    setup: Setup, case: str
) -> None:
    hostile = HOSTILE_CASES[case]
    tracemalloc.start()
    try:
        answer = hostile.run(setup)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND_BYTES, f"{case}: {peak / 1e6:.0f} MB allocated"
    hostile.expect(answer)
    reply = setup.a.chat.completions.create(model="good", messages=HELLO)
    assert reply.choices[0].message.content == "Hello from fake-model."


def test_usage_is_checked_against_what_was_sent(setup: Setup) -> None:
    reply = setup.a.chat.completions.create(model="lying-usage", messages=HELLO, max_tokens=16)
    assert reply.choices[0].message.content == "Hello from a liar."
    usage = reply.usage
    assert usage is not None
    body_bytes = len(json.dumps(setup.hostile.bodies[-1]).encode())
    assert 1 <= usage.prompt_tokens <= body_bytes + 4096  # usage.py PromptBounds
    assert 1 <= usage.completion_tokens <= 16
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0  # hidden: no salt on this server


@pytest.mark.parametrize(("model", "salted"), [("salted", True), ("good", False)])
def test_no_tenant_reads_anothers_prefix(setup: Setup, model: str, salted: bool) -> None:
    history = [{"role": "user", "content": f"secret plan for {model} " * 40}]
    headers = {"X-Talaria-Session-Id": f"plan-{model}"}
    first = setup.a.chat.completions.create(model=model, messages=history, extra_headers=headers)
    reply = {"role": "assistant", "content": first.choices[0].message.content}
    again = [*history, reply, {"role": "user", "content": "go on"}]
    own = setup.a.chat.completions.create(model=model, messages=again, extra_headers=headers)
    other = setup.b.chat.completions.create(model=model, messages=again, extra_headers=headers)
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in (own, other)]  # type: ignore[union-attr]
    # salted: A's continuation finds its own prefix, B's identical prompt none of A's;
    # without a salt the server would give B A's prefix: no tenant is shown any
    assert cached == ([cached[0], 0] if salted else [0, 0]) and (cached[0] > 0) is salted
    salts = [b.get("cache_salt") for b in setup.hostile.bodies[-3:]]
    if salted:
        assert salts[0] == salts[1] != salts[2] and all(salts)
    else:
        assert salts == [None, None, None]
