"""The parts of runtime/engines/vllm/chat.py that need no vLLM: special tokens kept out of the
reply's text (issue 26: SmolLM2's ``<|endoftext|>`` after a reply with tools, which vLLM keeps
in when a tool parser needs special tokens), and the engine stats kept per request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from talaria.core.calls import OutputDelta, ToolCallDelta
from talaria.runtime.engines.openai_wire import ChatChunk
from talaria.runtime.engines.vllm.chat import MeteredClient, VllmChat

SPECIAL = ("<|endoftext|>", "<|im_end|>")


def test_special_tokens_never_reach_the_text() -> None:
    chat = VllmChat(serving=SimpleNamespace(), model="m", special_tokens=SPECIAL)
    call = ToolCallDelta(0, "c1", "f", "{}")
    chunk = ChatChunk(OutputDelta("Done.<|endoftext|>", "", (call,)), (5, 0))
    cleaned = chat.clean(chunk)
    assert cleaned.delta.text == "Done." and cleaned.delta.tool_calls == (call,)
    assert cleaned.token_ids == (5, 0)  # the ids stay: the session's KV record needs them
    plain = VllmChat(serving=SimpleNamespace(), model="m")
    assert plain.clean(chunk) is chunk


class FakeLlm:
    def __init__(self) -> None:
        self.closed = False

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        try:
            for step in range(3):
                yield SimpleNamespace(request_id="chatcmpl-r1", metrics=f"stats {step}")
        finally:
            self.closed = True

    def abort(self) -> str:
        return "aborted"


def test_the_metered_client_keeps_each_requests_last_stats() -> None:
    llm = FakeLlm()
    serving = SimpleNamespace(engine_client=llm)
    chat = VllmChat(serving=serving, model="m", llm=llm)
    assert isinstance(serving.engine_client, MeteredClient)
    assert serving.engine_client.abort() == "aborted"  # everything else is the engine's

    async def drain() -> None:
        async for _ in serving.engine_client.generate("prompt"):
            pass

    asyncio.run(drain())
    request = SimpleNamespace(request_id="r1")
    assert chat.metrics_of(request) == "stats 2"
    assert chat.metrics_of(request) is None  # forgotten once read
    assert llm.closed
