"""vLLM's ``ignore_eos`` through the proxy (core/calls.py ``Sampling.ignore_eos``): the reply
runs to the output limit, as a benchmark that holds output lengths to a trace's needs; without
it the simulated engine stops at its answer's end. The same flag reaches vLLM's chat body."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from talaria.core.calls import Call, Sampling
from talaria.proxy.contract.settings import ProxySettings
from talaria.runtime.engines.sim_reply import reply_length
from talaria.runtime.engines.vllm.chat import to_vllm_request
from tests.integration.server import RunningProxy, running_proxy

MODEL = "glm-4.5-fp8"
LIMIT = 2_000


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("eos")
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp}/proxy.db", time_scale=500.0, models=[MODEL]
    )
    with running_proxy(settings) as running:
        yield running


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_that_ignores_eos_runs_to_its_limit(proxy: RunningProxy, stream: bool) -> None:
    client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
    messages = [{"role": "user", "content": "explain the build"}]
    usage, seeded, finish = {}, {}, {}
    for ignore in (False, True):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=LIMIT,
            stream=stream,
            stream_options={"include_usage": True} if stream else openai.NOT_GIVEN,
            extra_body={"ignore_eos": ignore},
        )
        seeded[ignore] = reply_length(raw.headers["x-request-id"], LIMIT)
        reply = raw.parse()
        if stream:
            chunks = list(reply)  # type: ignore[arg-type]
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            usage[ignore] = chunks[-1].usage.completion_tokens  # type: ignore[union-attr]
            finish[ignore] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            text = reply.choices[0].message.content or ""  # type: ignore[union-attr]
            usage[ignore] = reply.usage.completion_tokens  # type: ignore[union-attr]
            finish[ignore] = reply.choices[0].finish_reason  # type: ignore[union-attr]
        assert text.startswith("[simulated]")  # the answer is written either way
    assert usage[True] == LIMIT and finish[True] == "length"  # as vLLM's: it ran to the limit
    # Without the flag the answer has its own length, seeded by the request id (lognormal,
    # median 150: runtime/engines/sim_reply.py), whatever that draw is.
    assert usage[False] == seeded[False]


def test_a_non_boolean_ignore_eos_is_refused_naming_it(proxy: RunningProxy) -> None:
    client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError, match="ignore_eos"):
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"ignore_eos": "yes"},
        )


@pytest.mark.parametrize("ignore", [False, True])
def test_vllm_is_asked_to_ignore_eos_only_when_the_caller_did(ignore: bool) -> None:
    call = Call(
        MODEL, messages=({"role": "user", "content": "x"},), sampling=Sampling(ignore_eos=ignore)
    )
    body = to_vllm_request(
        call, model=MODEL, request_id="r", priority=0, max_tokens=64, cache_salt=None
    )
    assert body.get("ignore_eos", False) is ignore
