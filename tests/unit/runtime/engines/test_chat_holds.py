"""Rule 5 on vLLM's chat path (runtime/engines/vllm/chat_generate.py ``chat``, chat.py
``resumable`` and ``resume_body``), against a fake chat serving layer in virtual time: a chat
call held for a higher class waits before it starts; once it streams, one whose text can be
continued is aborted at a visible character and resumed as its messages plus its text so far
(``continue_final_message``), and its text comes out whole; one that cannot (it offers tools)
runs on; an interactive chat call holds calls of a lower class on either path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pytest

from talaria.core.calls import DEFAULT_SAMPLING, Call, OutputDelta, ToolChoice, ToolSpec
from talaria.core.clock import LoopClock
from talaria.core.types import CallRequest, Finished, Priority
from talaria.runtime.engine import ClassStepRule
from talaria.runtime.engines.openai_wire import ChatChunk, ChatTotals
from talaria.runtime.engines.vllm import RateModel
from talaria.runtime.engines.vllm.chat import VllmChat, resumable, resume_body
from tests.unit.runtime.engines.test_vllm_engine_fake import STEP_S, make_engine, virtual

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
]
MESSAGES = ({"role": "user", "content": "go"},)
RULE = ClassStepRule(class_slowdown=1.0, preempt_limit=3)


def _answer(n: int) -> str:
    """The fake model's reply of ``n`` tokens: word i is one token, a space before all but the
    first."""
    return "".join(("" if i == 0 else " ") + WORDS[i % len(WORDS)] for i in range(n))


@dataclass
class FakeChat:
    """vLLM's chat serving layer as the engine uses it (``request``, ``stream``,
    ``metrics_of``), over a greedy model whose reply is ``_answer``: a body that continues an
    assistant message (``continue_final_message``) goes on from the tokens that text holds.
    It records each piece: (request id, start time, the continued text or None, its limit)."""

    clock: LoopClock
    resumed_extra: int | None = 0
    """Tokens a body that continues the assistant's text renders to beyond the first prompt's
    and the text's (None: it cannot be rendered, as a template may refuse)."""
    pieces: list[tuple[str, float, str | None, int]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)

    def request(self, body: dict[str, Any]) -> Any:
        return SimpleNamespace(body=body, request_id=body["request_id"])

    async def resume_room(self, body: dict[str, Any], text: str, max_model_len: int) -> int | None:
        return await VllmChat.resume_room(self, body, text, max_model_len)  # type: ignore[arg-type]

    async def prompt_tokens(self, body: dict[str, Any]) -> int | None:
        if not body.get("continue_final_message"):
            return 10
        if self.resumed_extra is None:
            return None
        return 10 + len(body["messages"][-1]["content"].split()) + self.resumed_extra

    def metrics_of(self, request: Any) -> Any:
        return None

    async def stream(self, request: Any, totals: ChatTotals) -> AsyncIterator[ChatChunk]:
        body = request.body
        limit = body["max_completion_tokens"]
        done = 0
        continued = None
        if body.get("continue_final_message"):
            assert body["add_generation_prompt"] is False
            assert body["messages"][:-1] == list(MESSAGES)  # the call's own messages, once
            continued = body["messages"][-1]["content"]
            assert continued == continued.rstrip(), "the template would strip its end"
            done = len(continued.split())
            assert _answer(done) == continued  # the text so far, whole
        self.pieces.append((request.request_id, self.clock.now(), continued, limit))
        totals.prompt_token_ids = list(range(10 + done))
        finished = False
        try:
            yield ChatChunk(OutputDelta(""))  # the role chunk: nothing yet
            for i in range(done, done + limit):
                await self.clock.sleep(STEP_S)
                text = ("" if i == 0 else " ") + WORDS[i % len(WORDS)]
                yield ChatChunk(OutputDelta(text), (i,))
            yield ChatChunk(OutputDelta(""), (), "length")
            totals.prompt_tokens, totals.completion_tokens = 10 + done, limit
            finished = True
        finally:
            if not finished:
                self.aborted.append(request.request_id)


def _chat_call(rid: str, priority: Priority, max_out: int, *, tools: bool = False) -> CallRequest:
    spec = ToolSpec("ls", "list files", {"type": "object"})
    call = Call("a", messages=MESSAGES, tools=(spec,) if tools else (), max_output_tokens=max_out)
    return CallRequest(
        request_id=rid, session_key=rid, model="a", prompt_tokens=100,
        max_output_tokens=max_out, stream=True, call=call, priority=priority,
    )  # fmt: skip


def _serve(
    calls: list[tuple[CallRequest, float]],
    rule: ClassStepRule | None,
    resumed_extra: int | None = 0,
) -> tuple[dict[str, tuple[str, int]], FakeChat, int, dict[str, float]]:
    """Serve ``calls`` (each after its delay) on one engine whose chat layer is a
    ``FakeChat``: each call's (text, output tokens), the fake, the engine's preemptions and
    each call's finish time."""

    async def body(clock: LoopClock) -> Any:
        engine, _ = make_engine(
            "a", clock, sleep_mode=False, rates=RateModel(decode_step_s_per_seq=2e-3)
        )
        await engine.start()
        await engine.activate()
        chat = FakeChat(clock, resumed_extra)
        engine._chat = chat  # type: ignore[assignment]  # the serving layer, faked
        engine.step_by_class(rule)
        ends: dict[str, float] = {}

        async def serve(req: CallRequest, after_s: float) -> tuple[str, tuple[str, int]]:
            await clock.sleep(after_s)
            admission = engine.try_admit(req, clock.now(), False)
            assert admission is not None
            events = [e async for e in engine.run(admission)]
            last = events[-1]
            assert isinstance(last, Finished) and last.result.output is not None
            streamed = "".join(e.delta.text for e in events[:-1])  # type: ignore[attr-defined]
            assert streamed == last.result.output.text  # what the client saw is the reply
            ends[req.request_id] = clock.now()
            return req.request_id, (last.result.output.text, last.result.output_tokens)

        out = await asyncio.gather(*(serve(req, after) for req, after in calls))
        return dict(out), chat, engine.preemptions, ends

    return virtual(body)


def test_held_chat_calls_resume_from_their_text_and_come_out_whole() -> None:
    texts, chat, preemptions, _ = _serve(
        [
            (_chat_call("bulk-1", Priority.BATCH, 40), 0.0),
            (_chat_call("bulk-2", Priority.BATCH, 40), 0.0),
            (_chat_call("ide", Priority.INTERACTIVE, 8), 10 * STEP_S),
        ],
        RULE,
    )
    assert texts == {
        "bulk-1": (_answer(40), 40),
        "bulk-2": (_answer(40), 40),
        "ide": (_answer(8), 8),
    }
    assert preemptions == 2
    by_call: dict[str, list[tuple[str | None, int]]] = {}
    for rid, _, continued, limit in chat.pieces:
        by_call.setdefault(rid.split("#")[0], []).append((continued, limit))
    assert by_call["ide"] == [(None, 8)]
    for bulk in ("bulk-1", "bulk-2"):
        (first, first_limit), (continued, again_limit) = by_call[bulk]
        assert first is None and first_limit == 40
        done = len(continued.split())  # type: ignore[union-attr]
        assert 0 < done < 40 and again_limit == 40 - done
    assert len(chat.aborted) == 2


def test_a_chat_call_held_twice_resumes_from_its_whole_text_each_time() -> None:
    texts, chat, preemptions, _ = _serve(
        [
            (_chat_call("bulk", Priority.BATCH, 60), 0.0),
            (_chat_call("ide-1", Priority.INTERACTIVE, 6), 10 * STEP_S),
            (_chat_call("ide-2", Priority.INTERACTIVE, 6), 30 * STEP_S),
        ],
        RULE,
    )
    assert texts["bulk"] == (_answer(60), 60)
    assert preemptions == 2
    continued = [c for rid, _, c, _ in chat.pieces if rid.startswith("bulk#")]
    assert len(continued) == 3 and continued[0] is None
    first, second = (len(c.split()) for c in continued[1:])  # type: ignore[union-attr]
    assert 0 < first < second < 60  # each resumption goes on from all the text so far


def test_a_chat_call_that_cannot_be_continued_runs_on_and_one_held_at_entry_waits() -> None:
    texts, chat, preemptions, ends = _serve(
        [
            (_chat_call("tools", Priority.BATCH, 40, tools=True), 0.0),
            (_chat_call("ide", Priority.INTERACTIVE, 8), 10 * STEP_S),
            (_chat_call("late", Priority.BATCH, 6), 12 * STEP_S),
        ],
        RULE,
    )
    assert texts["tools"] == (_answer(40), 40) and texts["late"] == (_answer(6), 6)
    assert [p[0].split("#")[0] for p in chat.pieces].count("tools") == 1  # never paused
    assert not chat.aborted
    late_start = next(start for rid, start, _, _ in chat.pieces if rid.startswith("late#"))
    assert late_start >= ends["ide"]  # it waited, before it started, for the interactive call
    assert preemptions == 1  # the late call, at its entry


@pytest.mark.parametrize(
    "resumed_extra",
    [
        None,  # vLLM cannot render the resumed body
        2048 - 10 - 20,  # the window (2,048) would not hold the tokens it has left
    ],
)
def test_a_chat_call_vllm_cannot_resume_whole_runs_on(resumed_extra: int | None) -> None:
    texts, chat, preemptions, _ = _serve(
        [
            (_chat_call("bulk", Priority.BATCH, 40), 0.0),
            (_chat_call("ide", Priority.INTERACTIVE, 8), 10 * STEP_S),
        ],
        RULE,
        resumed_extra,
    )
    assert texts == {"bulk": (_answer(40), 40), "ide": (_answer(8), 8)}
    assert len(chat.pieces) == 2 and not chat.aborted  # held once, checked, let run
    assert preemptions == 1


def test_without_a_rule_chat_calls_are_never_held() -> None:
    texts, chat, preemptions, _ = _serve(
        [
            (_chat_call("bulk", Priority.BATCH, 40), 0.0),
            (_chat_call("ide", Priority.INTERACTIVE, 8), 10 * STEP_S),
        ],
        None,
    )
    assert texts == {"bulk": (_answer(40), 40), "ide": (_answer(8), 8)}
    assert preemptions == 0 and len(chat.pieces) == 2 and not chat.aborted


@pytest.mark.parametrize(
    ("tools", "tool_choice_none", "response_format", "stop", "reasoning_parser", "expected"),
    [
        (False, False, None, (), None, True),
        (True, False, None, (), None, False),  # a tool parser's state is not in the text
        (True, True, None, (), None, True),  # tools offered, none may be called
        (False, False, {"type": "json_object"}, (), None, False),  # a grammar's state
        (False, False, None, ("END",), None, False),  # a stop string could span the cut
        (False, False, None, (), "qwen3", False),  # a reasoning parser's state
    ],
)
def test_which_chat_calls_can_be_resumed(
    tools: bool,
    tool_choice_none: bool,
    response_format: dict[str, str] | None,
    stop: tuple[str, ...],
    reasoning_parser: str | None,
    expected: bool,
) -> None:
    sampling = replace(DEFAULT_SAMPLING, response_format=response_format, stop=stop)
    call = Call(
        "a",
        messages=MESSAGES,
        tools=(ToolSpec("ls", "list", {"type": "object"}),) if tools else (),
        tool_choice=ToolChoice("none") if tool_choice_none else ToolChoice("auto"),
        sampling=sampling,
    )
    assert resumable(call, reasoning_parser) is expected


def test_the_resume_body_continues_the_assistants_text() -> None:
    body = {"messages": [{"role": "user", "content": "go"}], "max_completion_tokens": 40, "seed": 3}
    again = resume_body(body, "alpha beta", 38, "r#1")
    assert again["messages"] == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "alpha beta"},
    ]
    assert again["continue_final_message"] is True and again["add_generation_prompt"] is False
    assert again["max_completion_tokens"] == 38 and again["request_id"] == "r#1"
    assert again["seed"] == 3 and body["messages"] == [{"role": "user", "content": "go"}]
