"""A conversation as a chain of message fingerprints, so that a call can find the conversation
it continues with a few dictionary lookups.

Fingerprint of a message (``fingerprint``): a digest of its role (``developer`` counts as
``system``), its text with surrounding whitespace stripped, and its tool calls as (name,
canonical JSON arguments: parsed and dumped with sorted keys). Left out on purpose, because
agents change them when they send a reply back: tool-call ids, reasoning / thinking, cache
hints and content-block boundaries. Plus the message's estimated tokens (for prefix reuse).

Chain (``chain``): ``h_0 = ∅``, ``h_i = blake2b(h_{i−1} ‖ digest_i)``; ``h_i`` identifies the
first ``i`` messages, so a call whose first ``k`` messages equal a known conversation has that
conversation's value at position ``k``, and a change to any earlier message changes it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from talaria.core.calls import ToolSpec, content_text, message_tokens, tools_tokens

DIGEST_BYTES = 16


@dataclass(frozen=True)
class Fingerprint:
    """One message's digest (``DIGEST_BYTES`` bytes, see the module docstring), its estimated
    tokens and its role."""

    digest: bytes
    tokens: int
    role: str


def canonical_arguments(arguments: Any) -> Any:
    """Tool-call arguments in a form that ignores whitespace and key order."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):  # not JSON, or nested too deep to read: as text
            return arguments.strip()
    return json.loads(json.dumps(arguments, sort_keys=True))


def fingerprint(message: Mapping[str, Any]) -> Fingerprint:
    """The fingerprint of one OpenAI-form message (what it covers: the module docstring)."""
    role = str(message.get("role", ""))
    role = "system" if role == "developer" else role
    calls = []
    for call in message.get("tool_calls") or ():
        if isinstance(call, Mapping):
            function = call.get("function")
            function = function if isinstance(function, Mapping) else {}
            calls.append([function.get("name"), canonical_arguments(function.get("arguments"))])
    canonical = json.dumps(
        [role, content_text(message.get("content")).strip(), calls],
        sort_keys=True,
        separators=(",", ":"),
    )
    digest = hashlib.blake2b(canonical.encode(), digest_size=DIGEST_BYTES).digest()
    return Fingerprint(digest, message_tokens(message), role)


def tools_fingerprint(tools: Sequence[ToolSpec]) -> Fingerprint:
    """The tool definitions as one fingerprint: chat templates render them ahead of the
    messages, so they belong to a reused prefix when they did not change (they take no part in
    finding the session: an agent may change its tools mid-conversation)."""
    canonical = json.dumps([t.to_openai() for t in tools], sort_keys=True, separators=(",", ":"))
    digest = hashlib.blake2b(canonical.encode(), digest_size=DIGEST_BYTES).digest()
    return Fingerprint(digest, tools_tokens(tools), "tools")


def fingerprints(messages: Sequence[Mapping[str, Any]]) -> list[Fingerprint]:
    """The fingerprint of each message, in order."""
    return [fingerprint(m) for m in messages]


def chain(prints: Sequence[Fingerprint]) -> list[bytes]:
    """``[h_1, …, h_n]`` (see the module docstring)."""
    out: list[bytes] = []
    value = b""
    for p in prints:
        value = extend(value, p)
        out.append(value)
    return out


def extend(value: bytes, p: Fingerprint) -> bytes:
    """The chain value one message further: ``h_{i+1}`` from ``h_i``."""
    return hashlib.blake2b(value + p.digest, digest_size=DIGEST_BYTES).digest()


@dataclass(frozen=True)
class Conversation:
    """A call's messages as fingerprints, their chain values and the running token sums,
    computed once per call."""

    prints: tuple[Fingerprint, ...]
    hashes: tuple[bytes, ...]
    """``h_1 … h_n``."""
    tokens: tuple[int, ...]
    """``tokens[i]``: estimated tokens of the first ``i`` messages (``tokens[0] = 0``)."""

    @classmethod
    def of(cls, messages: Sequence[Mapping[str, Any]]) -> Conversation:
        """The conversation of these OpenAI-form messages."""
        prints = tuple(fingerprint(m) for m in messages)
        totals = [0]
        for p in prints:
            totals.append(totals[-1] + p.tokens)
        return cls(prints, tuple(chain(prints)), tuple(totals))

    def __len__(self) -> int:
        return len(self.prints)

    @property
    def last(self) -> bytes | None:
        """The chain value of the whole conversation (None when empty)."""
        return self.hashes[-1] if self.hashes else None


EMPTY = Conversation((), (), (0,))
