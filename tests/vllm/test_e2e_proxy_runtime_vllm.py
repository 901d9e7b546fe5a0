"""End to end with real parts: the real ``openai`` client → proxy (real HTTP, SQLite) →
``talaria runtime`` (a real process, real HTTP) → two vLLM engines (CPU build, tiny
random-weight Llamas). Prefix-cache hits come from vLLM; slots alternate; SP admits."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import httpx
import openai
import pytest

from talaria.proxy.contract.settings import ProxySettings
from tests.integration.server import RunningProxy, running_proxy
from tests.vllm.runtime_process import running_runtime

pytestmark = pytest.mark.vllm

# The four original flags (round-robin slots, one model resident at a time): these tests watch
# slots alternate and SP admit continuations. With co-residency both CPU engines would simply
# stay resident (the fidelity run, tests/vllm/test_fidelity_live.py, serves them that way).
NODE = """
[node]
name = "cpu-node"
policy = "-co_residency-demand_slots"
quantum_s = 1.0

[[model]]
name = "tiny-a"
engine = "vllm"
path = "tiny-llama-a"
max_model_len = 2048

[[model]]
name = "tiny-b"
engine = "vllm"
path = "tiny-llama-b"
max_model_len = 2048
"""


@pytest.fixture(scope="module")
def runtime_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("vllm-node")
    config = tmp / "node.toml"
    config.write_text(NODE)
    with running_runtime(config) as url:
        yield url


@pytest.fixture(scope="module")
def proxy(runtime_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("vllm-proxy")
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp}/p.db",
        admin_token="admin-secret-token",
        runtimes=[runtime_url],
    )
    with running_proxy(settings) as running:
        yield running


def _session(client: openai.OpenAI, model: str, sid: str, calls: int) -> list[int]:
    """A session of ``calls`` calls, each announcing a 50 ms tool gap (so the runtime may hold
    a soft reservation and admit the continuation into the running slot)."""
    messages = [{"role": "user", "content": f"Please fix issue {sid}. " * 12}]
    cached = []
    headers = {"X-Talaria-Session-Id": sid, "X-Talaria-Tool-Gap-Ms": "50"}
    for step in range(calls):
        reply = client.chat.completions.create(
            model=model, messages=messages, max_tokens=12, extra_headers=headers
        )
        cached.append(reply.usage.prompt_tokens_details.cached_tokens)
        assert reply.usage.completion_tokens == 12  # dummy weights: runs to max_tokens
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"tool output {step}: ok"},
        ]
    return cached


def test_session_through_proxy_runtime_and_vllm(proxy: RunningProxy, runtime_url: str) -> None:
    client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
    assert sorted(m.id for m in client.models.list()) == ["tiny-a", "tiny-b"]
    cached = _session(client, "tiny-a", "vllm-s1", 4)
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])  # vLLM's prefix cache
    stream = client.chat.completions.create(
        model="tiny-b",
        messages=[{"role": "user", "content": "stream from the second model"}],
        max_tokens=10,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and not text.startswith("[simulated]")  # real (random) tokens, detokenized
    assert chunks[-1].usage.completion_tokens == 10
    detail = httpx.get(
        proxy.base_url + "/admin/sessions/vllm-s1",
        headers={"Authorization": "Bearer admin-secret-token"},
    ).json()
    assert [c["instance"] for c in detail["calls"]] == ["cpu-node"] * 4
    assert detail["calls"][-1]["cached_tokens"] > 0


def test_slots_alternate_and_sp_admits_continuations(proxy: RunningProxy, runtime_url: str) -> None:
    import concurrent.futures

    client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [
            pool.submit(_session, client, model, f"alt-{model}-{i}", 8)
            for i in range(2)
            for model in ("tiny-a", "tiny-b")
        ]
        for future in futures:
            future.result()
    slots = httpx.get(runtime_url + "/v1/runtime/status").json()["slots"]
    models = [s["model"] for s in slots]
    changes = sum(1 for a, b in itertools.pairwise(models) if a != b)
    assert {"tiny-a", "tiny-b"} <= set(models) and changes >= 2
    assert sum(s["sp_admitted"] for s in slots) >= 1


def test_a_prompt_longer_than_the_engine_takes_is_a_400(proxy: RunningProxy) -> None:
    """The proxy's estimate (about 4 characters a token) lets 3,000 characters through; the
    byte tokenizer counts 3,000+ tokens, over tiny-a's max_model_len of 2048: vLLM is never
    asked, and the caller gets OpenAI's context_length_exceeded, not a 503."""
    client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny-a",
            messages=[{"role": "user", "content": "word " * 600}],
            max_tokens=8,
            extra_headers={"X-Talaria-Session-Id": "too-long"},
        )
    assert info.value.code == "context_length_exceeded"
    assert "maximum context length is 2048" in info.value.message
