"""What an upstream server's output and usage may claim, checked against what was sent (pure
rules; the engine applies them, generation.py).

A server is trusted to generate, not to count: its deltas are counted as they come and the
output is cut at the call's limit (``OutputBudget``), and the usage of its last chunk is
checked against the request and the output before it is recorded (``checked_usage``):
a count outside its range is clamped into it and named in ``UsageCheck.faults`` (the engine
logs them), never recorded as sent.

How output tokens are counted without the server's tokenizer: a delta (one chunk's text,
reasoning, tool-call fragments and logprobs) counts

    n(delta) = max(1, token ids it carries, logprob entries it carries, ⌈bytes / B⌉)

with ``B = MAX_TOKEN_BYTES`` (256): no token decodes to more bytes than that, so a delta of
b bytes holds at least ⌈b / B⌉ tokens, and a chunk holds at least one (vLLM and llama.cpp's
server send one chunk per decode step). The count is a floor on what the server generated
as long as it sends no chunk without a token; the output stops before the delta that would
take it past the limit (that delta is dropped whole, and the call finishes with
``length``). A server that sends its text in large chunks is thus cut early rather than late.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from talaria.core.calls import OutputDelta

MAX_TOKEN_BYTES = 256
"""The most UTF-8 bytes one token is taken to decode to. The longest token of SmolLM2's
vocabulary (tokenizer.json of scripts/real-model.sh's model) decodes to 81 bytes (a run of
spaces after a newline); code vocabularies hold longer runs of whitespace; 256 leaves room
for them."""
PROMPT_TEMPLATE_TOKENS = 4096
"""Tokens a chat template may add to the messages and tools it renders: role markers (~5 a
message), a default system prompt (Llama 3.1's date lines, ~25), tool instructions (Hermes'
~300), with a wide margin."""
MEDIA_PART_TOKENS = 16384
"""Tokens one non-text content part (an image, an audio clip) may render to: Qwen2-VL's
default ``max_pixels`` (12.8 MP) at 28 × 28 pixels a token is 16,384."""
REPLY_BASE_BYTES = 1 << 16
"""Bytes a stream may carry besides its tokens' chunks (the role, finish, usage and
``[DONE]`` lines; an error chunk)."""


def delta_bytes(delta: OutputDelta) -> int:
    """UTF-8 bytes of what ``delta`` says: text, reasoning, tool-call names and arguments."""
    parts = [delta.text, delta.reasoning]
    for call in delta.tool_calls:
        parts += [call.name or "", call.arguments]
    return sum(len(p.encode()) for p in parts)


def delta_tokens(delta: OutputDelta, token_ids: int) -> int:
    """``n(delta)`` of the module docstring: the fewest tokens ``delta`` can hold."""
    text = math.ceil(delta_bytes(delta) / MAX_TOKEN_BYTES)
    return max(1, token_ids, len(delta.logprobs), text)


@dataclass
class OutputBudget:
    """A call's output as it streams, held to ``limit_tokens`` (module docstring)."""

    limit_tokens: int
    counted_tokens: int = 0
    """The tokens of the deltas taken (each at least ``delta_tokens``)."""
    text_bytes: int = 0
    """Their bytes (``delta_bytes``)."""
    cut: bool = False
    """A delta was refused: the output reached the limit and the server went on."""

    def take(self, delta: OutputDelta, token_ids: int) -> bool:
        """Whether ``delta`` fits within the limit; if it does it is counted, else ``cut``."""
        tokens = delta_tokens(delta, token_ids)
        if self.counted_tokens + tokens > self.limit_tokens:
            self.cut = True
            return False
        self.counted_tokens += tokens
        self.text_bytes += delta_bytes(delta)
        return True

    @property
    def floor_tokens(self) -> int:
        """The fewest tokens the output taken can be: ``⌈text bytes / MAX_TOKEN_BYTES⌉``."""
        return math.ceil(self.text_bytes / MAX_TOKEN_BYTES)


def reply_max_bytes(limit_tokens: int, bytes_per_token: int) -> int:
    """The most bytes a call's stream may carry: ``REPLY_BASE_BYTES`` + limit × bytes per
    token (options.py ``reply_bytes_per_token``)."""
    return REPLY_BASE_BYTES + max(0, limit_tokens) * bytes_per_token


@dataclass(frozen=True)
class PromptBounds:
    """The prompt tokens a server may report for what it was sent: at least ``floor`` (the
    messages' text at ``MAX_TOKEN_BYTES`` a token, at least 1), at most ``ceiling`` (one
    token per byte of the request's body, plus ``PROMPT_TEMPLATE_TOKENS`` and
    ``MEDIA_PART_TOKENS`` per non-text part: a token is at least a byte of the rendered
    prompt, and the body holds every byte the caller sent)."""

    floor: int
    ceiling: int


def prompt_bounds(messages: Sequence[Mapping[str, Any]], body_bytes: int) -> PromptBounds:
    """``PromptBounds`` of a request whose messages are ``messages`` and whose JSON body is
    ``body_bytes`` long."""
    text = 0
    media = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            text += len(content.encode())
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == "text":
                    text += len(str(part.get("text", "")).encode())
                else:
                    media += 1
    floor = max(1, math.ceil(text / MAX_TOKEN_BYTES))
    ceiling = body_bytes + PROMPT_TEMPLATE_TOKENS + media * MEDIA_PART_TOKENS
    return PromptBounds(floor, max(floor, ceiling))


@dataclass(frozen=True)
class UsageCheck:
    """A call's usage as recorded: each count within its range, and what was out of range."""

    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    faults: tuple[str, ...] = ()
    """One line per count the server sent out of range: its value and the one recorded."""


def _clamp(name: str, sent: int, low: int, high: int, faults: list[str]) -> int:
    kept = min(max(sent, low), high)
    if kept != sent:
        faults.append(f"{name} {sent} outside [{low}, {high}]: recorded {kept}")
    return kept


def checked_usage(
    *,
    prompt_sent: int | None,
    output_sent: int | None,
    cached_sent: int,
    prompt: PromptBounds,
    prompt_estimate: int,
    budget: OutputBudget,
) -> UsageCheck:
    """The usage to record from what the server sent (None: it sent no usage, or the stream
    was cut before it; then the request's ``prompt_estimate`` and the ``budget``'s count):

    - prompt tokens within ``prompt`` (``PromptBounds``);
    - output tokens within [``budget.floor_tokens``, ``budget.limit_tokens``] — at most the
      limit sent, at least what the text needs; a count of 0 for a reply that has text is
      taken as "not counted" (the budget's count), as before;
    - cached tokens within [0, the prompt tokens recorded].
    """
    faults: list[str] = []
    if prompt_sent is None:
        prompt_tokens = min(max(prompt_estimate, prompt.floor), prompt.ceiling)
    else:
        prompt_tokens = _clamp("prompt_tokens", prompt_sent, prompt.floor, prompt.ceiling, faults)
    if output_sent is None or (output_sent == 0 and budget.counted_tokens > 0):
        output_tokens = budget.counted_tokens
    else:
        low = min(budget.floor_tokens, budget.limit_tokens)
        output_tokens = _clamp("completion_tokens", output_sent, low, budget.limit_tokens, faults)
    cached_tokens = _clamp("cached_tokens", cached_sent, 0, prompt_tokens, faults)
    return UsageCheck(prompt_tokens, output_tokens, cached_tokens, tuple(faults))


def usage_count(value: Any) -> int | None:
    """A usage count as a server sent it: a whole number (an integral float too), else None
    (absent, a string, a bool, NaN or infinite: not a count)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


@dataclass(frozen=True)
class SentUsage:
    """The counts of a chunk's ``usage`` as the server sent them (None: absent or not a
    count)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None


def read_usage(doc: Any) -> SentUsage | None:
    """``usage`` of a chunk (OpenAI's: ``prompt_tokens``, ``completion_tokens``,
    ``prompt_tokens_details.cached_tokens``); None if it is not an object."""
    if not isinstance(doc, Mapping):
        return None
    details = doc.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return SentUsage(
        usage_count(doc.get("prompt_tokens")),
        usage_count(doc.get("completion_tokens")),
        usage_count(cached),
    )
