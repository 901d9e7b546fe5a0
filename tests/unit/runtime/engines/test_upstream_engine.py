"""The upstream engine (``engine = "openai"``, runtime/engines/upstream/) against a fake
OpenAI-compatible server (tests/fake_upstream.py) on a loopback port: the chat request it
sends, the deltas it maps (text, tool calls, reasoning), usage and cached tokens, a client
going away, errors, start-up checks, options, and the sleep / wake endpoints it calls."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from bench.harness.processes import free_port
from talaria.core.calls import Call, OutputDelta, Sampling, ToolCall, ToolCallDelta, ToolSpec
from talaria.core.clock import LoopClock
from talaria.core.types import (
    CallRejected,
    CallRequest,
    CallResult,
    Finished,
    FirstToken,
    GenerationEvent,
    KvSource,
    TokenDelta,
)
from talaria.runtime.config import NodeConfigError
from talaria.runtime.engines.upstream import (
    UpstreamEngine,
    UpstreamUnavailable,
    build_upstream_engine,
    normalise_url,
    upstream_options,
)
from talaria.runtime.engines.upstream import engine as upstream_engine
from talaria.runtime.engines.upstream.client import served_window
from talaria.runtime.engines.upstream.reading import UpstreamUnreachable
from tests.fake_upstream import FakeUpstream, fake_upstream

T = TypeVar("T")
USER = {"role": "user", "content": "hi"}


def run(main: Callable[[], Awaitable[T]]) -> T:
    async def wrapped() -> T:
        return await main()

    return asyncio.run(wrapped())


def engine_for(url: str, **options: Any) -> UpstreamEngine:
    return build_upstream_engine("fake-model", {"url": url, **options}, LoopClock(), "node0")


def request(
    text: str, *, session: str = "s1", stream: bool = True, history: tuple[Any, ...] = (),
    rid: str = "r1", cache_salt: str | None = None, **call: Any,
) -> CallRequest:  # fmt: skip
    messages = (*history, {"role": "user", "content": text})
    c = Call("fake-model", messages=messages, stream=stream, **call)
    return CallRequest(
        rid, session, "fake-model", c.prompt_tokens(), 64, stream=stream, call=c,
        cache_salt=cache_salt,
    )  # fmt: skip


async def serve(engine: UpstreamEngine, req: CallRequest) -> list[GenerationEvent]:
    admission = engine.try_admit(req, 0.0, False)
    assert admission is not None
    return [e async for e in engine.run(admission)]


def result_of(events: list[GenerationEvent]) -> CallResult:
    last = events[-1]
    assert isinstance(last, Finished)
    return last.result


def deltas(events: list[GenerationEvent]) -> list[OutputDelta]:
    out = []
    for e in events:
        if isinstance(e, FirstToken | TokenDelta):
            assert e.delta is not None
            out.append(e.delta)
    return out


async def started(fake: FakeUpstream, **options: Any) -> UpstreamEngine:
    engine = engine_for(fake.url, **options)
    await engine.start()
    await engine.activate()
    return engine


def test_text_streams_as_deltas_with_usage_and_the_request_carries_the_call() -> None:
    async def main() -> tuple[list[GenerationEvent], dict[str, Any], UpstreamEngine]:
        async with fake_upstream() as fake:
            engine = await started(fake)
            tools = (ToolSpec("get_weather", "the weather", {"type": "object"}),)
            sampling = Sampling(temperature=0.0, top_p=0.9, seed=7, stop=("END",), logprobs=True,
                                response_format={"type": "json_object"})  # fmt: skip
            req = request("hi", tools=tools, sampling=sampling, max_output_tokens=20)
            events = await serve(engine, req)
            await engine.shutdown()
            return events, fake.bodies[0], engine

    events, body, engine = run(main)
    assert isinstance(events[0], FirstToken) and events[0].kv_source is KvSource.NEW
    assert [d.text for d in deltas(events)] == ["Hello ", "from ", "fake-model."]
    assert all(isinstance(e, TokenDelta) and e.tokens == 1 for e in events[1:-1])
    result = result_of(events)
    assert result.output is not None and result.output.text == "Hello from fake-model."
    assert result.output_tokens == 3 and result.cached_tokens == 0
    assert result.kv_source is KvSource.NEW and result.prompt_tokens > 1
    assert body["model"] == "fake-model" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 64 and body["temperature"] == 0.0 and body["top_p"] == 0.9
    assert body["seed"] == 7 and body["stop"] == ["END"] and body["logprobs"] is True
    assert body["response_format"] == {"type": "json_object"}
    assert body["tools"][0]["function"]["name"] == "get_weather"
    assert body["tool_choice"] == "auto" and engine.running == 0


def test_a_call_without_a_limit_leaves_it_to_the_server_and_unstreamed_folds() -> None:
    async def main() -> tuple[list[GenerationEvent], dict[str, Any]]:
        async with fake_upstream() as fake:
            engine = await started(fake)
            events = await serve(engine, request("hi", stream=False))
            await engine.shutdown()
            return events, fake.bodies[0]

    events, body = run(main)
    assert "max_tokens" not in body and body["stream"] is True  # always streamed inside
    assert [type(e) for e in events] == [FirstToken, Finished]
    out = result_of(events).output
    assert out is not None and out.text == "Hello from fake-model."


@pytest.mark.parametrize(
    ("isolation", "salted", "shown"),
    [("salt", True, True), ("share", False, True), ("hide", False, False)],
)
def test_a_continuation_reports_cached_tokens_as_its_isolation_says(
    isolation: str, salted: bool, shown: bool
) -> None:
    async def main() -> tuple[CallResult, CallResult, dict[str, Any], list[dict[str, Any]]]:
        async with fake_upstream() as fake:
            engine = await started(fake, cache_isolation=isolation)
            first = result_of(await serve(engine, request("hi", cache_salt="t1")))
            assert first.output is not None
            history = (USER, first.output.as_message())
            more = request("more", history=history, rid="r2", cache_salt="t1")
            second = result_of(await serve(engine, more))
            kv = engine.session_kv()
            await engine.shutdown()
            return first, second, kv, fake.bodies

    first, second, kv, bodies = run(main)
    assert first.cached_tokens == 0 and first.kv_source is KvSource.NEW
    # the server reused the prefix whatever the mode: the KV source says so (operator-only)
    assert second.kv_source is KvSource.HBM
    assert (second.cached_tokens > 0) is shown  # what the caller sees
    assert [b.get("cache_salt") for b in bodies] == (["t1", "t1"] if salted else [None, None])
    assert kv["s1"] == (second.prompt_tokens + second.output_tokens, KvSource.HBM)


def test_the_default_isolation_salts_only_a_vllm_server() -> None:
    assert upstream_options("m", {"url": "http://h"}).cache_isolation == "hide"
    assert upstream_options("m", {"url": "http://h", "sleep": "sglang"}).cache_isolation == "hide"
    assert upstream_options("m", {"url": "http://h", "sleep": "vllm"}).cache_isolation == "salt"
    with pytest.raises(NodeConfigError, match="cache_isolation"):
        upstream_options("m", {"url": "http://h", "cache_isolation": "maybe"})


def test_tool_call_fragments_map_to_the_vllm_engines_deltas() -> None:
    async def main() -> list[GenerationEvent]:
        async with fake_upstream() as fake:
            engine = await started(fake)
            events = await serve(engine, request("call a tool"))
            await engine.shutdown()
            return events

    events = run(main)
    calls = [c for d in deltas(events) for c in d.tool_calls]
    assert calls == [
        ToolCallDelta(0, "call_1", "get_weather", '{"city":'),
        ToolCallDelta(0, None, None, ' "Paris"}'),
    ]
    out = result_of(events).output
    assert out is not None and out.finish_reason == "tool_calls"
    assert out.tool_calls == (ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)


def test_reasoning_content_maps_to_reasoning_deltas() -> None:
    async def main() -> list[GenerationEvent]:
        async with fake_upstream() as fake:
            engine = await started(fake)
            events = await serve(engine, request("think first"))
            await engine.shutdown()
            return events

    events = run(main)
    assert [d.reasoning for d in deltas(events)] == ["Let me ", "think.", ""]
    out = result_of(events).output
    assert out is not None and out.reasoning == "Let me think." and out.text == "42"


def test_the_client_going_away_closes_the_upstream_stream() -> None:
    async def main() -> tuple[int, int, int]:
        async with fake_upstream() as fake:
            engine = await started(fake)
            admission = engine.try_admit(request("slow please"), 0.0, False)
            assert admission is not None
            events = engine.run(admission)
            got = [await anext(events) for _ in range(3)]
            assert isinstance(got[0], FirstToken)
            await events.aclose()
            for _ in range(100):
                if fake.disconnects:
                    break
                await asyncio.sleep(0.02)
            running = engine.running
            await engine.shutdown()
            return fake.disconnects, fake.completed_streams, running

    disconnects, completed, running = run(main)
    assert disconnects == 1 and completed == 0 and running == 0


@pytest.mark.parametrize(
    ("text", "error", "code"),
    [
        ("x" * 2000, CallRejected, "context_length_exceeded"),
        ("boom", UpstreamUnavailable, None),
        ("die now", UpstreamUnavailable, None),
    ],
    ids=["context-400", "server-500", "dies-mid-stream"],
)
def test_upstream_errors_map_to_the_callers_fault_or_a_runtime_fault(
    text: str, error: type[Exception], code: str | None
) -> None:
    async def main() -> Exception:
        async with fake_upstream() as fake:
            engine = await started(fake)
            try:
                with pytest.raises(error) as caught:
                    await serve(engine, request(text))
                assert engine.running == 0
            finally:
                await engine.shutdown()
            return caught.value

    exc = run(main)
    if code is not None:
        assert isinstance(exc, CallRejected) and exc.code == code
        assert "maximum context length" in str(exc)


def test_an_upstream_that_went_down_is_a_runtime_fault_until_it_answers_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call that finds the server gone fails (503) and the engine turns faulty (``Health``:
    the node's status leaves its model out); it asks the server every ``PROBE_S`` and serves
    again once it answers."""
    monkeypatch.setattr(upstream_engine, "PROBE_S", 0.05)

    async def main() -> None:
        async with fake_upstream() as fake:
            engine = await started(fake)
            port = int(fake.url.rsplit(":", 1)[1])
        try:
            assert engine.fault() is None
            with pytest.raises(UpstreamUnreachable, match=r"upstream http://127\.0\.0\.1"):
                await serve(engine, request("hi"))
            assert (
                engine.fault()
                == f"upstream http://127.0.0.1:{port}/v1/chat/completions: ConnectError"
            )
            await asyncio.sleep(0.2)
            assert engine.fault() is not None  # still down: every probe failed
            async with fake_upstream(port=port):
                for _ in range(100):
                    if engine.fault() is None:
                        break
                    await asyncio.sleep(0.05)
                assert engine.fault() is None
                assert result_of(await serve(engine, request("hi again"))).output_tokens > 0
        finally:
            await engine.shutdown()

    run(main)


def test_start_names_an_url_that_does_not_answer_and_a_model_it_does_not_serve() -> None:
    url = f"http://127.0.0.1:{free_port()}"

    async def main() -> tuple[str, str, int]:
        engine = engine_for(url)
        with pytest.raises(UpstreamUnavailable) as down:
            await engine.start()
        async with fake_upstream(model="other", max_model_len=777) as fake:
            engine = engine_for(fake.url)
            with pytest.raises(UpstreamUnavailable) as missing:
                await engine.start()
            await engine.shutdown()
            served = engine_for(fake.url, served_model="other")
            await served.start()
            window = served.info().max_model_len
            await served.shutdown()
        return str(down.value), str(missing.value), window

    down, missing, window = run(main)
    assert f"{url}/v1/models" in down
    # what the server lists goes to the log, not into the error (a placer could read it)
    assert "does not serve 'fake-model' (it lists 1 models" in missing and "/v1" in missing
    assert "other" not in missing
    assert window == 777


@pytest.mark.parametrize(
    ("entry", "window"),
    [
        ({"id": "m", "max_model_len": 32768}, 32768),  # vLLM, SGLang
        # llama.cpp's server: one slot's context (-c 4096 -np 2), not the model's training one
        ({"id": "m", "meta": {"n_ctx": 2048, "n_ctx_train": 8192}}, 2048),
        ({"id": "m", "max_model_len": 4096, "meta": {"n_ctx": 2048}}, 4096),
        ({"id": "m"}, None),  # neither: context_window must be given
        ({"id": "m", "meta": "n_ctx"}, None),
        ({"id": "m", "max_model_len": True}, None),
        ({"id": "m", "max_model_len": 0, "meta": {"n_ctx": -1}}, None),
        # a window no model has would lift the reply's byte bound (it follows the limit)
        ({"id": "m", "max_model_len": 10**12, "meta": {"n_ctx": 8192}}, 8192),
        ({"id": "m", "max_model_len": 10**12}, None),
    ],
)
def test_the_window_a_server_reports(entry: dict[str, Any], window: int | None) -> None:
    assert served_window(entry) == window


def test_options_are_checked_and_the_url_normalised(monkeypatch: pytest.MonkeyPatch) -> None:
    for given in ("http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"):
        assert normalise_url(given) == "http://h:1/v1"
    opt = upstream_options("m", {"url": "http://h:1"})
    assert (opt.served_model, opt.sleep, opt.base, opt.weight_bytes) == (
        "m",
        "none",
        "http://h:1",
        0,
    )
    with pytest.raises(NodeConfigError, match="needs a 'url'"):
        upstream_options("m", {})
    with pytest.raises(NodeConfigError, match="sleep must be one of"):
        upstream_options("m", {"url": "http://h", "sleep": "deep"})
    with pytest.raises(NodeConfigError, match="unknown option"):
        upstream_options("m", {"url": "http://h", "max_model_len": 5})
    with pytest.raises(NodeConfigError, match="api_key_env 'NOPE_KEY' is not set"):
        upstream_options("m", {"url": "http://h", "api_key_env": "NOPE_KEY"})
    monkeypatch.setenv("UP_KEY", "sekret")
    assert upstream_options("m", {"url": "http://h", "api_key_env": "UP_KEY"}).api_key == "sekret"


def test_the_api_key_is_sent_as_a_bearer_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UP_KEY", "sekret")

    async def main() -> CallResult:
        async with fake_upstream(api_key="sekret") as fake:
            engine = await started(fake, api_key_env="UP_KEY")
            events = await serve(engine, request("hi"))
            await engine.shutdown()
            return result_of(events)

    assert run(main).output_tokens == 3


def test_vllm_sleep_endpoints_at_start_switches_and_staging() -> None:
    async def main() -> tuple[list[str], list[tuple[str, str]]]:
        async with fake_upstream() as fake:
            engine = engine_for(fake.url, sleep="vllm", staging=True, weight_bytes=1e9)
            await engine.start()  # awake → put to sleep
            assert engine.weight_bytes == 1e9 and engine.info().switches_cost
            await engine.activate()  # full wake
            await serve(engine, request("hi"))
            await engine.deactivate(False, True)
            assert engine.start_staging()
            for _ in range(100):
                if fake.switches()[-1] == "/wake_up?tags=weights":
                    break
                await asyncio.sleep(0.01)
            assert engine.staged_fraction == 1.0
            await engine.activate()  # only the KV pool is left
            await engine.shutdown()
            return fake.switches(), fake.log

    switches, log = run(main)
    assert log[:3] == [("GET", "/v1/models"), ("GET", "/is_sleeping"), ("POST", "/sleep?level=1")]
    assert switches == [
        "/sleep?level=1", "/wake_up", "/sleep?level=1", "/wake_up?tags=weights",
        "/wake_up?tags=kv_cache",
    ]  # fmt: skip


def test_sglang_release_and_resume_and_none_calls_nothing() -> None:
    async def main() -> tuple[list[str], list[str], float]:
        async with fake_upstream() as fake, fake_upstream() as plain:
            engine = engine_for(fake.url, sleep="sglang")
            await engine.start()
            await engine.activate()
            await serve(engine, request("hi"))
            await engine.deactivate(False, True)
            assert not engine.start_staging()
            await engine.shutdown()
            gate = engine_for(plain.url, weight_bytes=5e9)
            await gate.start()
            await gate.activate()
            await gate.deactivate(False, True)
            await gate.shutdown()
            return fake.switches(), plain.switches(), gate.weight_bytes

    sglang, none, weights = run(main)
    assert sglang == [
        "/release_memory_occupation", "/resume_memory_occupation", "/release_memory_occupation"
    ]  # fmt: skip
    assert none == [] and weights == 0.0  # no sleep endpoints: always resident


def test_a_call_after_a_sleep_recomputes_its_session() -> None:
    async def main() -> CallResult:
        async with fake_upstream() as fake:
            engine = await started(fake, sleep="vllm")
            first = result_of(await serve(engine, request("hi")))
            assert first.output is not None
            await engine.deactivate(False, True)
            assert engine.session_kv() == {}
            await engine.activate()
            history = (USER, first.output.as_message())
            result = result_of(await serve(engine, request("more", history=history, rid="r2")))
            await engine.shutdown()
            return result

    result = run(main)
    assert result.cached_tokens == 0 and result.kv_source is KvSource.RECOMPUTE
    assert result.recomputed_tokens > 0


def test_a_failed_wake_opens_the_engine_and_fails_its_calls_as_faults() -> None:
    async def main() -> None:
        async with fake_upstream() as fake:
            engine = engine_for(fake.url, sleep="vllm")
            await engine.start()
        await engine.activate()  # the server is gone: logged, not raised
        assert engine.active
        try:
            with pytest.raises(UpstreamUnavailable, match="fake-model: not awake"):
                await serve(engine, request("hi"))
            assert engine.running == 0
            await engine.deactivate(False, True)  # its sleep fails too: logged
        finally:
            await engine.shutdown()

    run(main)
