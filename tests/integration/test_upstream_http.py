"""Through HTTP: a ``talaria runtime --config node.toml`` process whose model is
``engine = "openai"`` in front of a fake OpenAI-compatible server (tests/fake_upstream.py),
reached by a proxy: the client gets the server's output (text, a tool call, cached tokens on a
continuation), a context overflow is the client's 400 and a failing server a 503."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest

from bench.harness.processes import talaria_runtime
from talaria.proxy.contract.settings import ProxySettings
from tests.fake_upstream import FakeUpstream, fake_upstream_thread
from tests.integration.server import running_proxy

NODE_TOML = """
[node]
name = "up-rt"
quantum_s = 5

[[model]]
name = "fronted"
engine = "openai"
url = "{url}"
served_model = "fake-model"
sleep = "vllm"
context_window = 100000  # more than the server's own window: its 400 reaches the client
"""


@dataclass
class Setup:
    fake: FakeUpstream
    client: openai.OpenAI


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("up")
    with fake_upstream_thread(max_model_len=2048) as fake:
        config = tmp / "node.toml"
        config.write_text(NODE_TOML.format(url=fake.url))
        with talaria_runtime(config) as runtime:
            settings = ProxySettings(
                database_url=f"sqlite+aiosqlite:///{tmp}/p.db", runtimes=[runtime.base_url]
            )
            with running_proxy(settings) as proxy:
                yield Setup(fake, openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0))


def test_a_chat_call_gets_the_upstreams_reply_and_cached_tokens(setup: Setup) -> None:
    client = setup.client
    assert [m.id for m in client.models.list()] == ["fronted"]
    messages = [{"role": "user", "content": "hello there " * 20}]
    first = client.chat.completions.create(
        model="fronted", messages=messages, extra_headers={"x-session-id": "u1"}
    )
    assert first.choices[0].message.content == "Hello from fake-model."
    messages += [
        {"role": "assistant", "content": "Hello from fake-model."},
        {"role": "user", "content": "and a tool please"},
    ]
    chunks = list(
        client.chat.completions.create(
            model="fronted",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
            extra_headers={"x-session-id": "u1"},
        )
    )
    parts = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta]
    calls = [p for part in parts if part for p in part]
    assert calls[0].function.name == "get_weather"
    assert "".join(p.function.arguments or "" for p in calls) == '{"city": "Paris"}'
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
    assert [p for _, p in setup.fake.log[:3]] == ["/v1/models", "/is_sleeping", "/sleep?level=1"]
    assert ("POST", "/wake_up") in setup.fake.log


def test_upstream_errors_reach_the_client_as_400_and_503(setup: Setup) -> None:
    client = setup.client
    with pytest.raises(openai.BadRequestError) as overflow:
        client.chat.completions.create(
            model="fronted", messages=[{"role": "user", "content": "x " * 6000}], max_tokens=8
        )
    assert overflow.value.status_code == 400
    assert overflow.value.code == "context_length_exceeded"
    assert "maximum context length is 2048" in overflow.value.message  # the server's words
    with pytest.raises(openai.InternalServerError) as down:
        client.chat.completions.create(
            model="fronted", messages=[{"role": "user", "content": "boom"}]
        )
    assert down.value.status_code == 503
