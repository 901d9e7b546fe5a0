"""What the simulated engine says: replies an agent can act on, marked as simulated.

The simulated engine times generation with the cost model; this module writes the content of a
live call's reply (a replayed trace entry has no content and gets none):

- **Tool calls while the conversation is young.** When tools are offered and ``tool_choice``
  allows, and the conversation holds fewer than ``ReplyPolicy.tool_calls_before_answer`` earlier
  tool calls, the reply calls one harmless offered tool (``pick_tool``: listing, then reading,
  then a shell given ``ls``; never one that writes, edits, deletes or spawns) with arguments
  valid against its JSON schema (core/schema_instance.py). ``required`` or a named ``tool_choice``
  forces a call.
- **Then a final answer**, so a headless agent run ends by itself: placeholder words starting
  with ``[simulated]``, as many as a seeded reply length (lognormal, median 150 tokens, sigma
  0.9: docs/sources.md §2's visible output per call of SWE-agent-style agents), capped by the call's
  output limit (``finish_reason`` ``length`` when the cap cuts it). With ``response_format``
  asking for JSON, the answer is a schema-valid JSON document instead. Stop sequences cut the
  text as a real engine's would.
- **Reasoning**, when the caller asked for some (a reasoning effort other than ``none``): one
  short sentence, also marked.

``ReplyStream`` hands the reply out token by token, in proportion to the engine's progress, so
streamed text and tool-call arguments arrive as the simulated decode advances.
"""

from __future__ import annotations

import json
import math
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from talaria.core.calls import (
    Call,
    FinishReason,
    ModelOutput,
    OutputDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    count_tool_calls,
    estimate_tokens,
)
from talaria.core.schema_instance import instance, name_words, response_schema
from talaria.core.types import CallRequest

OUTPUT_MEDIAN_TOKENS = 150.0
OUTPUT_SIGMA = 0.9
"""Reply length: lognormal median 150, sigma 0.9 (docs/sources.md §2, visible output per call of
SWE-agent-style agents), seeded by the request id."""

DEFAULT_TOOL_CALLS_BEFORE_ANSWER = 3

WORDS = (
    "simulated", "tokens", "from", "the", "talaria", "engine", "timed", "by", "its", "cost",
    "model", "no", "real", "text", "was", "generated", "here", "session", "aware", "serving",
)  # fmt: skip

_LISTING = frozenset({"list", "ls", "glob", "dir", "directory", "tree", "files"})
_READING = frozenset({"read", "view", "cat", "search", "grep", "find", "show", "lookup"})
_SHELL = frozenset({"bash", "shell", "exec", "command", "terminal", "run"})
_UNSAFE = frozenset({
    "write", "edit", "delete", "remove", "rm", "patch", "apply", "create", "update", "agent",
    "agents", "task", "spawn", "kill", "close", "goal", "skill", "workflow", "schedule", "wakeup",
    "input", "image", "web", "fetch", "send", "post", "move", "rename", "todo", "plan",
    "notebook", "mcp", "ask", "question", "exit", "memory", "save", "stdin", "deferred",
    "placeholder", "tool", "call", "replace", "insert", "multi", "put", "set", "upload",
})  # fmt: skip
_COMMAND_KEYS = ("command", "cmd")


@dataclass(frozen=True)
class ReplyPolicy:
    """How the simulated engine answers live calls (the module docstring says what it
    writes)."""

    tool_calls_before_answer: int = DEFAULT_TOOL_CALLS_BEFORE_ANSWER
    """A conversation with this many earlier tool calls gets a final answer (``auto``)."""


DEFAULT_REPLIES = ReplyPolicy()


def reply_length(request_id: str, limit: int) -> int:
    """Seeded lognormal reply length in tokens, capped at ``limit``."""
    rng = random.Random(zlib.crc32(request_id.encode()))
    drawn = OUTPUT_MEDIAN_TOKENS * math.exp(OUTPUT_SIGMA * rng.gauss(0.0, 1.0))
    return max(1, min(limit, round(drawn)))


def words(start: int, count: int) -> str:
    """``count`` placeholder words (one per token), continuing from token ``start``."""
    out = ["[simulated]" if i == 0 else WORDS[i % len(WORDS)] for i in range(start, start + count)]
    text = " ".join(out)
    return text if start == 0 or not text else " " + text


def _harmlessness(tool: ToolSpec) -> int:
    """3 listing, 2 reading, 1 a shell that takes a command, 0 not harmless."""
    name = name_words(tool.name)
    if not name or name & _UNSAFE:
        return 0
    if name & _LISTING:
        return 3
    if name & _READING:
        return 2
    properties = tool.parameters.get("properties")
    if (
        name & _SHELL
        and isinstance(properties, dict)
        and any(k in properties for k in _COMMAND_KEYS)
    ):
        return 1
    return 0


def pick_tool(tools: Sequence[ToolSpec]) -> ToolSpec | None:
    """The most harmless offered tool (ties: the first offered), or None if none is."""
    best: ToolSpec | None = None
    best_score = 0
    for tool in tools:
        score = _harmlessness(tool)
        if score > best_score:
            best, best_score = tool, score
    return best


def _tool_call(request: CallRequest, tool: ToolSpec) -> ToolCall:
    arguments = instance(dict(tool.parameters)) if tool.parameters else {}
    if not isinstance(arguments, dict):
        arguments = {}
    return ToolCall(
        id=f"call_{zlib.crc32(request.request_id.encode()):08x}",
        name=tool.name,
        arguments=json.dumps(arguments),
    )


def _chosen_tool(call: Call, policy: ReplyPolicy) -> ToolSpec | None:
    choice = call.tool_choice
    if not call.tools or choice.mode == "none":
        return None
    if choice.mode == "named":
        return next((t for t in call.tools if t.name == choice.name), None)
    picked = pick_tool(call.tools)
    if choice.mode == "required":
        return picked or call.tools[0]
    earlier = count_tool_calls(call.messages or ())
    return picked if earlier < policy.tool_calls_before_answer else None


def _json_answer(call: Call) -> str | None:
    fmt = call.sampling.response_format
    if not fmt or fmt.get("type") == "text":
        return None
    schema = response_schema(fmt)
    if schema is not None:
        return json.dumps(instance(schema))
    return json.dumps({"simulated": True})


def _cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def plan_reply(request: CallRequest, policy: ReplyPolicy) -> tuple[ModelOutput, int]:
    """The reply to a live call and its length in tokens (at least 1)."""
    asked = request.call if request.call is not None else Call(request.model)
    limit = request.max_output_tokens
    reasoning = ""
    tool = _chosen_tool(asked, policy)
    if asked.wants_reasoning:
        action = f"call {tool.name}" if tool else "answer"
        reasoning = f"[simulated reasoning] The conversation so far asks me to {action}."
    reasoning_tokens = estimate_tokens(reasoning)
    if tool is not None:
        call = _tool_call(request, tool)
        tokens = reasoning_tokens + estimate_tokens(call.name + call.arguments)
        if tokens <= limit:
            return ModelOutput("", reasoning, (call,), "tool_calls"), tokens
    answer = _json_answer(asked)
    if answer is not None:
        tokens = reasoning_tokens + estimate_tokens(answer)
        return ModelOutput(answer, reasoning, (), "stop"), min(max(1, tokens), limit)
    room = max(1, limit - reasoning_tokens)
    drawn = reply_length(request.request_id, 10**9)
    count = min(drawn, room)
    text, stopped = _cut_at_stop(words(0, count), asked.sampling.stop)
    finish: FinishReason = "stop" if stopped or drawn <= room else "length"
    if asked.sampling.ignore_eos and not stopped:
        finish = "length"  # it runs on to the limit past its answer's end, as vLLM's would
    tokens = min(limit, reasoning_tokens + max(1, estimate_tokens(text) if stopped else count))
    return ModelOutput(text, reasoning, (), finish), tokens


class ReplyStream:
    """Hands out ``output`` over ``tokens`` tokens: token k carries characters
    ``[⌊k·L/T⌋, ⌊(k+1)·L/T⌋)`` of the reply laid end to end (reasoning, text, then each tool
    call's arguments), so the pieces arrive in proportion to decoding."""

    def __init__(self, output: ModelOutput, tokens: int) -> None:
        self.output = output
        self.tokens = max(1, tokens)
        self._segments: list[tuple[str, int, str]] = []  # (kind, tool index, text)
        if output.reasoning:
            self._segments.append(("reasoning", -1, output.reasoning))
        if output.text:
            self._segments.append(("text", -1, output.text))
        for i, call in enumerate(output.tool_calls):
            self._segments.append(("tool", i, call.arguments))
        self._length = sum(len(s[2]) for s in self._segments)
        self._sent_tokens = 0
        self._sent_chars = 0
        self._announced: set[int] = set()

    def take(self, tokens: int) -> OutputDelta:
        """The next ``tokens`` tokens' worth of the reply (everything left at the end)."""
        self._sent_tokens = min(self.tokens, self._sent_tokens + tokens)
        end = self._length * self._sent_tokens // self.tokens
        start, self._sent_chars = self._sent_chars, end
        text, reasoning, calls = [], [], []
        offset = 0
        for kind, index, body in self._segments:
            lo, hi = max(start, offset), min(end, offset + len(body))
            begins = kind == "tool" and index not in self._announced and start <= offset < end
            if hi > lo or begins:
                piece = body[lo - offset : hi - offset] if hi > lo else ""
                if kind == "reasoning":
                    reasoning.append(piece)
                elif kind == "text":
                    text.append(piece)
                else:
                    call = self.output.tool_calls[index]
                    head = index not in self._announced
                    self._announced.add(index)
                    calls.append(
                        ToolCallDelta(
                            index,
                            call.id if head else None,
                            call.name if head else None,
                            piece,
                        )
                    )
            offset += len(body)
        if self._sent_tokens == self.tokens:  # calls with empty arguments still get announced
            for index, call in enumerate(self.output.tool_calls):
                if index not in self._announced:
                    self._announced.add(index)
                    calls.append(ToolCallDelta(index, call.id, call.name, ""))
        return OutputDelta("".join(text), "".join(reasoning), tuple(calls))
