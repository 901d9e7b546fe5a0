"""The fair queue's rule 5 on vLLM's chat path, on real vLLM (the CPU build): a tiny
random-weight model with a real Hugging Face tokenizer and chat template (tiny_chat.py) served
in this process by a ``VLLMEngine`` whose chat calls go through vLLM's own serving layer
(runtime/engines/vllm/chat.py). With no slowdown allowed, two batch chat calls streaming are
aborted when an interactive chat call enters, and resumed once it has finished as their
messages plus their text so far, which vLLM's chat template leaves open
(``continue_final_message``): each still gives all its tokens, and what it streamed is its
text. (The engine here has no reasoning or tool parser: with one, a streaming chat call runs
on, tests/unit/runtime/engines/test_chat_holds.py.)"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("vllm")

from talaria.core.calls import Call, Sampling
from talaria.core.clock import LoopClock
from talaria.core.types import CallRequest, Finished, FirstToken, Priority
from talaria.runtime.engines.vllm import VLLMEngine, build_vllm_engine
from tests.vllm.holds import held_for_an_interactive_call
from tests.vllm.tiny_chat import build_tiny_chat

pytestmark = pytest.mark.vllm

T = TypeVar("T")
NAME = "tiny-chat"
GREEDY = Sampling(temperature=0.0, ignore_eos=True)


class Node:
    """The module's event loop and its started engine; ``bodies``: each chat request's body."""

    def __init__(self, model_dir: Path) -> None:
        self.runner = asyncio.Runner()
        self.clock = LoopClock()
        self.engine: VLLMEngine = build_vllm_engine(
            model_dir, NAME, self.clock, "cpu0", max_model_len=2048
        )
        self.bodies: dict[str, list[dict[str, Any]]] = {}

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    async def start(self) -> None:
        await self.engine.start()
        chat = self.engine._chat
        assert chat is not None  # a Hugging Face tokenizer: chat calls go through vLLM's layer
        request = chat.request

        def recorded(body: Any) -> Any:
            self.bodies.setdefault(body["request_id"].split("#")[0], []).append(dict(body))
            return request(body)

        chat.request = recorded  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    node = Node(build_tiny_chat(tmp_path_factory.mktemp("tiny-chat")))
    try:
        node.run(node.start())
        yield node
    finally:
        node.run(node.engine.shutdown())
        node.runner.close()
        gc.collect()


def _call(rid: str, priority: Priority, max_out: int) -> CallRequest:
    messages = ({"role": "user", "content": f"write the test for {rid}"},)
    return CallRequest(
        request_id=rid,
        session_key=rid,
        model=NAME,
        prompt_tokens=16,
        max_output_tokens=max_out,
        stream=True,
        call=Call(NAME, messages=messages, sampling=GREEDY, max_output_tokens=max_out),
        priority=priority,
    )


def test_batch_chat_calls_held_for_an_interactive_one_resume_from_their_text(node: Node) -> None:
    engine = node.engine

    async def body() -> tuple[int, list[Any], list[list[Any]]]:
        await engine.activate()
        batch = [_call(f"bulk-{i}", Priority.BATCH, 64) for i in range(2)]
        ide = _call("ide", Priority.INTERACTIVE, 8)
        return await held_for_an_interactive_call(engine, node.clock, batch, ide)

    preemptions, ide_events, bulk_events = node.run(body())
    assert preemptions == 2
    assert len(node.bodies["ide"]) == 1
    ide_done = ide_events[-1].result
    for i, events in enumerate(bulk_events):
        head, *deltas, done = events
        assert isinstance(head, FirstToken) and isinstance(done, Finished)
        result = done.result
        assert result.output_tokens == 64 and result.output.finish_reason == "length"
        streamed = head.delta.text + "".join(d.delta.text for d in deltas)
        assert streamed == result.output.text
        assert ide_done.finished_s < result.finished_s
        first, again, *more = node.bodies[f"bulk-{i}"]
        assert not more and first["max_completion_tokens"] == 64
        so_far = again["messages"][-1]
        assert again["messages"][:-1] == first["messages"]
        assert so_far["role"] == "assistant" and again["continue_final_message"] is True
        text = so_far["content"]
        assert text and not text[-1].isspace() and result.output.text.startswith(text)
        assert 0 < again["max_completion_tokens"] < 64
