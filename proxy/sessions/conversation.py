"""A conversation as a chain of message fingerprints, so that a call can find the conversation
it continues with a few dictionary lookups.

Fingerprint of a message (``fingerprint``): a digest of its role (``developer`` counts as
``system``), its text with surrounding whitespace stripped, and its tool calls as (name,
canonical JSON arguments: parsed and dumped with sorted keys). Left out on purpose, because
agents change them when they send a reply back: tool-call ids, reasoning / thinking, cache
hints and content-block boundaries. Plus the message's estimated tokens (for prefix reuse).

Chain (``chain``): ``h_0 = ∅``, ``h_i = H(h_{i−1} ‖ digest_i)``; ``h_i`` identifies the
first ``i`` messages, so a call whose first ``k`` messages equal a known conversation has that
conversation's value at position ``k``, and a change to any earlier message changes it.

``H`` is SHA-256 cut to ``DIGEST_BYTES``: OpenSSL's runs at about twice blake2b's speed on
x86 (SHA extensions), and a 128 KB conversation is hashed whole on every call. Canonical JSON
(arguments, tool definitions) is msgspec's with sorted keys: compact, UTF-8 as is. Neither is
stored: a replica computes them afresh, so a change of either only matters while replicas of
two versions place the same implicit session (proxy/cluster/owner.py), once.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec

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


_ENCODER = msgspec.json.Encoder(order="sorted")


@functools.lru_cache(maxsize=CANONICAL_CACHE)
def _canonical_text(arguments: str) -> bytes:
    try:
        parsed = msgspec.json.decode(arguments)
    except (msgspec.DecodeError, RecursionError):
        return _utf8(arguments.strip())
    return _canonical(parsed)


def _canonical(arguments: Any) -> bytes:
    try:
        return _ENCODER.encode(arguments)
    except (TypeError, ValueError, RecursionError):  # keys of mixed types; nested too deep
        return _utf8(repr(arguments))


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def canonical_arguments(arguments: Any) -> bytes:
    """Tool-call arguments as bytes that ignore whitespace and key order: parsed, then dumped
    with sorted keys (text that is not JSON, or nests too deep to read, stripped)."""
    if isinstance(arguments, str):
        return _canonical_text(arguments)
    return _canonical(arguments)


def fingerprint(message: Mapping[str, Any]) -> Fingerprint:
    """The fingerprint of one OpenAI-form message (what it covers: the module docstring):
    ``H`` over the length-prefixed role, stripped text (UTF-8) and each tool call's name and
    canonical arguments, so the text is read once, by the hash, and never re-encoded as
    JSON."""
    role = str(message.get("role", ""))
    role = "system" if role == "developer" else role
    text = content_text(message.get("content"))
    calls = message.get("tool_calls") or ()
    fields = [role.encode(), _utf8(text.strip())]
    for call in calls:
        if isinstance(call, Mapping):
            function = call.get("function")
            function = function if isinstance(function, Mapping) else {}
            fields.append(_utf8(str(function.get("name"))))
            fields.append(canonical_arguments(function.get("arguments")))
    return Fingerprint(_digest(fields), text_and_calls_tokens(text, calls), role)


def _digest(fields: Sequence[bytes]) -> bytes:
    """``H`` of the fields, each length-prefixed (no two sequences of fields feed it the same
    bytes), fed to it in one piece."""
    framed = b"".join(b for field in fields for b in (len(field).to_bytes(8, "little"), field))
    return hashlib.sha256(framed).digest()[:DIGEST_BYTES]


def tools_fingerprint(tools: Sequence[ToolSpec]) -> Fingerprint:
    """The tool definitions as one fingerprint: chat templates render them ahead of the
    messages, so they belong to a reused prefix when they did not change (they take no part in
    finding the session: an agent may change its tools mid-conversation)."""
    canonical = _canonical([t.to_openai() for t in tools])
    return Fingerprint(_digest((canonical,)), tools_tokens(tools), "tools")


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
    return hashlib.sha256(value + p.digest).digest()[:DIGEST_BYTES]


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
