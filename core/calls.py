"""What a call asks for and what an engine answers, independent of any API dialect.

Every front door (OpenAI chat and completions, Anthropic Messages, OpenAI Responses) turns its
request into these types and renders them back (proxy/dialects/); routing, sessions and the
runtime never see a dialect. Messages are kept in OpenAI chat form — the form chat templates
take — as plain dicts: ``{"role": "system" | "user" | "assistant" | "tool", "content": str,
"tool_calls": [{"id", "type": "function", "function": {"name", "arguments"}}],
"tool_call_id": str, "reasoning_content": str}``.

An engine streams ``OutputDelta``s (text, reasoning and tool-call fragments, in the order the
model produced them) and finishes with one ``ModelOutput``; the simulated engine writes its
replies itself (runtime/engines/sim_reply.py), so nothing between the engine and the client
makes output up.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Message = dict[str, Any]
"""One chat message in OpenAI form (see the module docstring)."""

ToolChoiceMode = Literal["auto", "none", "required", "named"]
FinishReason = Literal["stop", "length", "tool_calls"]

BYTES_PER_TOKEN = 4.0
"""English BPE tokenizers average ~4 bytes of text per token (OpenAI's rule of thumb; est.)."""

MESSAGE_OVERHEAD_TOKENS = 4
"""Chat-format tokens around each message (role markers), as in OpenAI's token counting."""


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call: its name, description and JSON-schema parameters."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    strict: bool | None = None
    """OpenAI's strict function calling: the arguments must follow ``parameters`` (an engine
    with structured outputs enforces it)."""

    def to_openai(self) -> dict[str, Any]:
        """The tool as an OpenAI chat ``tools`` entry (what chat templates render)."""
        function: dict[str, Any] = {"name": self.name, "parameters": dict(self.parameters)}
        if self.description:
            function["description"] = self.description
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    """``auto`` (the model decides), ``none``, ``required`` (some tool), or ``named``."""

    mode: ToolChoiceMode = "auto"
    name: str | None = None


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters as the caller gave them (None: the engine's default)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: Mapping[str, Any] | None = None
    """OpenAI's ``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema":
    {"name", "schema"}}``; None or ``{"type": "text"}`` for free text."""
    ignore_eos: bool = False
    """vLLM's extension: generate up to the output limit past the end of sequence (the
    reply's length is then the limit: benchmarks hold output lengths to a trace's so)."""


AUTO = ToolChoice()
DEFAULT_SAMPLING = Sampling()


@dataclass(frozen=True)
class Call:
    """A request as every dialect normalizes it: chat ``messages`` (or a text ``prompt``), the
    tools offered, the tool choice, sampling, the output limit (None: the server's default),
    whether to stream and whether reasoning was asked for."""

    model: str
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = AUTO
    sampling: Sampling = DEFAULT_SAMPLING
    max_output_tokens: int | None = None
    stream: bool = False
    reasoning_effort: str | None = None
    """None: the model's default; ``"none"``: no reasoning; else how much (``low``,
    ``medium``, ``high``, ...), as OpenAI's ``reasoning_effort``."""
    parallel_tool_calls: bool | None = None
    template_kwargs: Mapping[str, Any] | None = None
    """Extra chat-template variables (vLLM's ``chat_template_kwargs``, e.g.
    ``{"enable_thinking": false}``)."""

    @property
    def wants_reasoning(self) -> bool:
        """The caller asked for reasoning: an effort other than None or ``"none"``."""
        return self.reasoning_effort not in (None, "none")

    def prompt_tokens(self) -> int:
        """The proxy's estimate of the rendered prompt (messages or text, plus tools)."""
        if self.messages is not None:
            body = sum(message_tokens(m) for m in self.messages)
        else:
            body = estimate_tokens(self.prompt or "")
        return max(1, body + tools_tokens(self.tools))


@dataclass(frozen=True)
class ToolCall:
    """One whole tool call of a reply: its id, the tool's name and the arguments."""

    id: str
    name: str
    arguments: str
    """The arguments as JSON text, exactly as the model wrote them."""


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log probability, and the most likely alternatives (``top``:
    (token, logprob) pairs) when they were asked for."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class ToolCallDelta:
    """A fragment of tool call ``index`` of this reply: the first fragment of a call carries its
    ``id`` and ``name``; every fragment may carry more ``arguments`` text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class OutputDelta:
    """What newly generated tokens say."""

    text: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()

    @property
    def empty(self) -> bool:
        """The delta carries nothing: no text, reasoning, tool-call fragment or logprob."""
        return not (self.text or self.reasoning or self.tool_calls or self.logprobs)


@dataclass(frozen=True)
class ModelOutput:
    """A whole reply: the text, the reasoning, the tool calls and why generation stopped."""

    text: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: FinishReason = "stop"
    logprobs: tuple[TokenLogprob, ...] = ()
    """Of the generated tokens, when the caller asked for them."""

    def as_message(self) -> Message:
        """The reply as the assistant message a client appends to its conversation."""
        message: Message = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        return message

    def deltas(self) -> list[OutputDelta]:
        """The reply as deltas, in order (reasoning, text, tool calls): what a client that
        streams gets when the engine produced the reply in one piece."""
        out = []
        if self.reasoning:
            out.append(OutputDelta(reasoning=self.reasoning))
        if self.text:
            out.append(OutputDelta(text=self.text))
        for i, c in enumerate(self.tool_calls):
            out.append(OutputDelta(tool_calls=(ToolCallDelta(i, c.id, c.name, c.arguments),)))
        if self.logprobs:
            out.append(OutputDelta(logprobs=self.logprobs))
        return out


class OutputAccumulator:
    """Folds ``OutputDelta``s back into a ``ModelOutput`` (what a streaming client would get)."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, list[str]] = {}
        self._heads: dict[int, tuple[str, str]] = {}
        self._logprobs: list[TokenLogprob] = []

    def add(self, delta: OutputDelta) -> None:
        """Fold in the next delta, in the order the engine produced it."""
        self._text.append(delta.text)
        self._reasoning.append(delta.reasoning)
        self._logprobs.extend(delta.logprobs)
        for part in delta.tool_calls:
            if part.id is not None and part.name is not None:
                self._heads[part.index] = (part.id, part.name)
            self._calls.setdefault(part.index, []).append(part.arguments)

    def output(self, finish_reason: FinishReason) -> ModelOutput:
        """The reply so far, ending for ``finish_reason``; a tool call whose first fragment
        (id and name) never came is left out."""
        calls = tuple(
            ToolCall(*self._heads[i], "".join(self._calls[i]))
            for i in sorted(self._calls)
            if i in self._heads
        )
        return ModelOutput(
            "".join(self._text),
            "".join(self._reasoning),
            calls,
            finish_reason,
            tuple(self._logprobs),
        )


# -- token estimates ------------------------------------------------------------------------


def estimate_tokens(text: str) -> int:
    """ceil(UTF-8 bytes / 4), at least 1 for non-empty text. The proxy's estimate for routing
    and context checks; engines report their own count. ASCII text (``str.isascii`` is a flag
    CPython keeps) is not encoded to be counted."""
    if not text:
        return 0
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return max(1, math.ceil(size / BYTES_PER_TOKEN))


def content_text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a content-part list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return str(content)


def message_tokens(message: Mapping[str, Any]) -> int:
    """Estimated tokens of one chat message: its text, its tool calls, and the role markers."""
    return text_and_calls_tokens(
        content_text(message.get("content")), message.get("tool_calls") or []
    )


def text_and_calls_tokens(text: str, calls: Any) -> int:
    """``message_tokens`` of a message whose text and tool calls are already at hand:
    estimate(text) + estimate(JSON of the calls) + ``MESSAGE_OVERHEAD_TOKENS``."""
    return (
        estimate_tokens(text)
        + (estimate_tokens(json.dumps(calls)) if calls else 0)
        + MESSAGE_OVERHEAD_TOKENS
    )


def tools_tokens(tools: Sequence[ToolSpec]) -> int:
    """Estimated tokens the tool definitions add to a rendered prompt."""
    if not tools:
        return 0
    return estimate_tokens(json.dumps([t.to_openai() for t in tools])) + MESSAGE_OVERHEAD_TOKENS


def count_tool_calls(messages: Sequence[Mapping[str, Any]]) -> int:
    """How many tool calls the assistant made earlier in this conversation."""
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
