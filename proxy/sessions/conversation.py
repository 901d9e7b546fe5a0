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

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from talaria.core.calls import ToolSpec, content_text, text_and_calls_tokens, tools_tokens

DIGEST_BYTES = 16


class Fingerprint(NamedTuple):
    """One message's digest (``DIGEST_BYTES`` bytes, see the module docstring), its estimated
    tokens and its role (a named tuple: one is made per message of every call)."""

    digest: bytes
    tokens: int
    role: str


CANONICAL_CACHE = 4096
"""Argument texts whose canonical form is remembered: an agent resends its earlier tool calls
with every call, so the same texts come back call after call."""


@functools.lru_cache(maxsize=CANONICAL_CACHE)
def _canonical_text(arguments: str) -> str:
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments.strip()
    return _canonical(parsed)


def _canonical(arguments: Any) -> str:
    try:
        return json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
    except (TypeError, ValueError, RecursionError):  # keys of mixed types; nested too deep
        return repr(arguments)


def canonical_arguments(arguments: Any) -> str:
    """Tool-call arguments as text that ignores whitespace and key order: parsed, then dumped
    with sorted keys (text that is not JSON, or nests too deep to read, stripped)."""
    if isinstance(arguments, str):
        return _canonical_text(arguments)
    return _canonical(arguments)


def fingerprint(message: Mapping[str, Any]) -> Fingerprint:
    """The fingerprint of one OpenAI-form message (what it covers: the module docstring):
    blake2b over the length-prefixed role, stripped text (UTF-8) and each tool call's name
    and canonical arguments, so the text is read once, by the hash, and never re-encoded as
    JSON."""
    role = str(message.get("role", ""))
    role = "system" if role == "developer" else role
    text = content_text(message.get("content"))
    calls = message.get("tool_calls") or ()
    fields = [role.encode(), text.strip().encode("utf-8", "surrogatepass")]
    for call in calls:
        if isinstance(call, Mapping):
            function = call.get("function")
            function = function if isinstance(function, Mapping) else {}
            fields.append(str(function.get("name")).encode("utf-8", "surrogatepass"))
            fields.append(
                canonical_arguments(function.get("arguments")).encode("utf-8", "surrogatepass")
            )
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for field in fields:  # length-prefixed: no two sequences of fields feed it the same bytes
        digest.update(len(field).to_bytes(8, "little"))
        digest.update(field)
    return Fingerprint(digest.digest(), text_and_calls_tokens(text, calls), role)


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
