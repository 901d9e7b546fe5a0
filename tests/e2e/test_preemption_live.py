"""The fair queue's rule 5 live (issue 49): real ``talaria runtime`` and ``talaria serve``
processes, a simulated engine on a scaled clock, two tenants by their API keys. Batch calls
with long contexts stream; interactive calls arrive while they do, and the engine holds the
batch calls out of the iterations that would slow the interactive ones past the node's
``class_slowdown`` (the default, 1.1×; the runtime's status counts the preemptions: more than
none, and at most the node TOML's ``preempt_limit`` for each batch call — 4 with the limit set
to 1). Every preempted stream then resumes and ends whole: its text is the simulated answer word
for word from its first word, no piece lost or repeated, and it counts every token it was
asked for; no call fails."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import openai

from bench.harness.processes import talaria_runtime, talaria_serve, tenant_key
from talaria.runtime.engines.sim_reply import words

MODEL = "glm-4.5-fp8"
LIMIT = 1
"""The node's preempt_limit (its default is 10): each batch call is held at most once, so the
count bounds what this node was told, not the default."""
SCALE = 5
"""Simulated seconds per wall second: a batch call decodes for ~8 wall seconds, long enough
for the interactive calls to arrive while every batch call runs, on a loaded machine too."""
NODE = f"""
[node]
name = "fair"
policy = "talaria"
time_scale = {SCALE}
preempt_limit = {LIMIT}

[[model]]
name = "{MODEL}"
engine = "sim"
"""
BATCH_CALLS = 4
BATCH_CONTEXT_WORDS = 8_000
"""Each batch call's prompt (~20k tokens): four of them beside one short interactive call make
a decode step ~1.5× the interactive call's alone (runtime/costmodel.py), past the 1.1× rule 5
allows."""
BATCH_TOKENS = 4_000
INTERACTIVE_CALLS = 3


def _keys(data: Path) -> dict[str, str]:
    url = f"sqlite+aiosqlite:///{data / 'talaria.db'}"
    return {
        tenant: tenant_key(url, tenant, "--priority", priority)
        for tenant, priority in (("bulk", "batch"), ("ide", "interactive"))
    }


async def _batch_call(
    client: openai.AsyncOpenAI, index: int, streaming: asyncio.Event
) -> tuple[str, int, str | None]:
    """One streamed batch call: (its text, completion tokens, finish reason); sets
    ``streaming`` at its first piece of text."""
    prompt = " ".join(f"line{i}" for i in range(BATCH_CONTEXT_WORDS))
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=BATCH_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
        extra_headers={"x-talaria-session-id": f"bulk-{index}"},
    )
    text, tokens, finish = [], 0, None
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.delta.content:
                text.append(choice.delta.content)
                streaming.set()
            finish = choice.finish_reason or finish
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return "".join(text), tokens, finish


async def _drive(base: str, keys: dict[str, str]) -> tuple[list[tuple[str, int, str | None]], int]:
    bulk = openai.AsyncOpenAI(base_url=base, api_key=keys["bulk"], max_retries=0, timeout=300)
    ide = openai.AsyncOpenAI(base_url=base, api_key=keys["ide"], max_retries=0, timeout=300)
    started = [asyncio.Event() for _ in range(BATCH_CALLS)]
    batch = [asyncio.create_task(_batch_call(bulk, i, started[i])) for i in range(BATCH_CALLS)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), timeout=120)
    answered = 0
    for turn in range(INTERACTIVE_CALLS):  # one IDE session's turns, while the batch streams
        reply = await ide.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"fix the test, turn {turn}"}],
            max_tokens=64,
            extra_headers={"x-talaria-session-id": "ide-0"},
        )
        assert reply.choices[0].message.content
        answered += 1
    still_running = sum(not t.done() for t in batch)
    assert still_running == BATCH_CALLS, "the batch calls ended before the interactive turns"
    return list(await asyncio.gather(*batch)), answered


def test_preempted_streams_resume_whole_and_none_fails(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    keys = _keys(data)
    config = tmp_path / "node.toml"
    config.write_text(NODE)
    with talaria_runtime(config) as runtime:
        env = {"TALARIA_DATABASE_URL": f"sqlite+aiosqlite:///{data / 'talaria.db'}"}
        args = ["--runtime", runtime.base_url, "--time-scale", str(SCALE)]
        with talaria_serve(args, env, data) as proxy:
            results, answered = asyncio.run(_drive(proxy.v1, keys))
        status = httpx.get(runtime.base_url + "/v1/runtime/status", timeout=30).json()
    assert answered == INTERACTIVE_CALLS
    preemptions = status["engines"][MODEL]["preemptions"]
    assert 0 < preemptions <= BATCH_CALLS * LIMIT, preemptions  # held, each at most k times
    for text, tokens, finish in results:
        assert finish == "length" and tokens == BATCH_TOKENS
        assert text == words(0, len(text.split())), text[:200]  # whole: nothing lost or repeated
