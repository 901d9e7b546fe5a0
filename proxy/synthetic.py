"""What the simulated engine "says": token estimates for text, and synthetic replies.

The simulated engine times generation but produces no text, so the gateway renders its token
counts as clearly synthetic words (every reply starts with ``[simulated]``) and, when the caller
offers tools, as a tool call. A real engine (vLLM, issue 4) returns real tokens instead.
"""

from __future__ import annotations

import json
import math
import random
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

BYTES_PER_TOKEN = 4.0
"""English BPE tokenizers average ~4 bytes of text per token (OpenAI's rule of thumb; est.)."""

MESSAGE_OVERHEAD_TOKENS = 4
"""Chat-format tokens around each message (role markers), as in OpenAI's token counting."""

OUTPUT_MEDIAN_TOKENS = 150.0
OUTPUT_SIGMA = 0.9
"""Synthetic reply length when the caller sets no smaller limit: lognormal median 150, sigma 0.9
(FACTS.md §2, visible output per call of SWE-agent-style agents), seeded by the request id."""

WORDS = (
    "simulated", "tokens", "from", "the", "talaria", "engine", "timed", "by", "its", "cost",
    "model", "no", "real", "text", "was", "generated", "here", "session", "aware", "serving",
)  # fmt: skip


def estimate_tokens(text: str) -> int:
    """ceil(UTF-8 bytes / 4), at least 1 for non-empty text."""
    if not text:
        return 0
    return max(1, math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN))


def content_text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a content-part list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return str(content)


def output_tokens_for(request_id: str, limit: int) -> int:
    """Seeded lognormal reply length, capped at ``limit``."""
    rng = random.Random(zlib.crc32(request_id.encode()))
    drawn = OUTPUT_MEDIAN_TOKENS * math.exp(OUTPUT_SIGMA * rng.gauss(0.0, 1.0))
    return max(1, min(limit, round(drawn)))


def words(start: int, count: int) -> str:
    """``count`` synthetic words (one per token), continuing from token ``start``."""
    out = []
    for i in range(start, start + count):
        out.append("[simulated]" if i == 0 else WORDS[i % len(WORDS)])
    text = " ".join(out)
    return text if start == 0 else " " + text


def pick_tool(tools: Sequence[dict[str, Any]] | None, tool_choice: Any) -> str | None:
    """The function the synthetic reply calls: the named one, else the first offered tool;
    None when no tools are offered or ``tool_choice`` is "none"."""
    if not tools or tool_choice == "none":
        return None
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        if isinstance(name, str):
            return name
    first = tools[0].get("function", {}) if isinstance(tools[0], dict) else {}
    name = first.get("name") if isinstance(first, dict) else None
    return name if isinstance(name, str) else None


def tool_call(request_id: str, name: str) -> dict[str, Any]:
    return {
        "id": f"call_{zlib.crc32(request_id.encode()):08x}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps({"simulated": True})},
    }


def chunks_of(text: str, size: int) -> Iterator[str]:
    for i in range(0, len(text), size):
        yield text[i : i + size]
