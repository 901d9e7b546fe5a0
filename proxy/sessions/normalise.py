"""Prompt normalisation: volatile parts of a call's system text that a client changes from
request to request although the conversation is the same, taken out before the call's session
is found and, by default, before its prompt reaches the engine.

Without it such a part changes message 0 on every turn: no continuation finds its thread (the
call is ``drifted``, proxy/sessions/drift.py) and no call reuses the KV after it. Gateways do
the same (NVIDIA Dynamo's ``DYN_STRIP_ANTHROPIC_PREAMBLE`` strips the line below).

The table (``VOLATILE_PARTS``): each row a name, a regular expression and its source. Built in,
one row:

- ``claude-code-attribution``: Claude Code's attribution line, ``x-anthropic-billing-header:
  cc_version=<version>.<fingerprint>; cc_entrypoint=<entrypoint>;`` and further ``cch=…;`` /
  ``cc_<field>=…;`` fields, alone on its line, with its line end (docs/sources.md §9: read from
  the pinned executable; ``cc_version`` carries a per-session fingerprint, ``cch`` a value per
  request where a build fills it in, ``cc_prev_req`` / ``cc_prompt_id`` / ``cc_*_index`` change
  per turn). A line that says anything else (another field form, more text after the fields,
  not at a line's start) stays.

An operator adds rows (``TALARIA_PROMPT_PATTERNS``: one Python regular expression a line, blank
lines ignored; named ``operator-1``, ``operator-2``, ... in their order; ``prompt_parts`` refuses
one that does not compile, naming it). A row's matches are removed (replaced by nothing); to
remove whole lines write ``(?m)^…\\n?``.

The rule (``normalise``): in the first ``MAX_SYSTEM_MESSAGES`` system (or developer) messages
of a conversation, in the first ``MAX_SCAN_CHARS`` characters of each (of its text parts
together, for a list of parts), cut back to the end of a line (a longer text with no line end
in them is not looked at), each row in table order removes its matches. Nothing else of a
call is touched: work per call is at most rows × ``MAX_SYSTEM_MESSAGES`` × ``MAX_SCAN_CHARS``
characters of regular-expression search (an operator's expression's own cost is the
operator's: a simple one takes ~0.1 ms over ``MAX_SCAN_CHARS``), and a row with a ``needle``
runs only where that text occurs (the built-in row: ~3 µs a message without the line).

Where it runs: proxy/callpath/door.py ``open_call``, once per call, before the call is placed
among replicas (an implicit session is placed by its first message) and its session found
(proxy/callpath/gateway.py fingerprints ``PreparedCall.session_messages``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from talaria.core.calls import Message
from talaria.proxy.contract.calls import NormalisedPrompt

MAX_SYSTEM_MESSAGES = 8
"""System messages of a conversation looked at (the first ones: the same whatever follows, so
a growing conversation keeps its normalised prefix). Claude Code sends two (its system prompt
and its environment notes)."""
MAX_SCAN_CHARS = 16_384
"""Characters of a system message looked at (its head, cut back to a line's end)."""
MAX_PATTERNS = 16
"""Operator patterns accepted (``TALARIA_PROMPT_PATTERNS``)."""
MAX_PATTERN_CHARS = 1_000
"""The longest operator pattern accepted."""
SYSTEM_ROLES = frozenset({"system", "developer"})

_VALUE = r"[^\s;]{0,128}"
ATTRIBUTION = re.compile(
    rf"^x-anthropic-billing-header: cc_version={_VALUE};"
    rf"(?: (?:cch|cc_[a-z][a-z_]{{0,31}})={_VALUE};){{0,32}}"
    r"[ \t]*(?:\r?\n|\Z)",
    re.MULTILINE,
)
"""Claude Code's attribution line and its line end (module docstring): each field a key
(``cch`` or ``cc_…``), ``=``, a value of up to 128 characters without white space or ``;``,
then ``;``; fields separated by one space, as the executable joins them."""


@dataclass(frozen=True)
class VolatilePart:
    """A row of the table: its ``name`` (what a call's record lists), the ``pattern`` whose
    matches are removed, where the pattern comes from (``source``), and a ``needle`` every
    match contains (the pattern runs only on text holding it; None: always)."""

    name: str
    pattern: re.Pattern[str]
    source: str
    needle: str | None = None


VOLATILE_PARTS: tuple[VolatilePart, ...] = (
    VolatilePart(
        "claude-code-attribution",
        ATTRIBUTION,
        "Claude Code 2.1.328's executable builds the line (docs/sources.md §9); "
        "CLAUDE_CODE_ATTRIBUTION_HEADER=0 turns it off at the client",
        needle="x-anthropic-billing-header:",
    ),
)
"""The built-in rows."""


@lru_cache(maxsize=8)
def prompt_parts(extra: str = "") -> tuple[VolatilePart, ...]:
    """The table: ``VOLATILE_PARTS`` and an operator's (``TALARIA_PROMPT_PATTERNS``: one
    regular expression a line, surrounding white space and blank lines ignored). ``ValueError``
    naming the pattern for one that is not a regular expression, longer than
    ``MAX_PATTERN_CHARS``, or past ``MAX_PATTERNS`` of them."""
    table = list(VOLATILE_PARTS)
    lines = [line.strip() for line in extra.splitlines()]
    patterns = [line for line in lines if line]
    if len(patterns) > MAX_PATTERNS:
        raise ValueError(
            f"TALARIA_PROMPT_PATTERNS: {len(patterns)} patterns, at most {MAX_PATTERNS}"
        )
    for n, text in enumerate(patterns, start=1):
        if len(text) > MAX_PATTERN_CHARS:
            raise ValueError(
                f"TALARIA_PROMPT_PATTERNS: pattern {n} is longer than {MAX_PATTERN_CHARS} "
                "characters"
            )
        try:
            compiled = re.compile(text)
        except re.error as exc:
            raise ValueError(
                f"TALARIA_PROMPT_PATTERNS: pattern {n} {text!r} is not a regular expression: {exc}"
            ) from None
        table.append(VolatilePart(f"operator-{n}", compiled, "TALARIA_PROMPT_PATTERNS"))
    return tuple(table)


def strip_text(
    text: str, parts: Sequence[VolatilePart], budget: int = MAX_SCAN_CHARS
) -> tuple[str, set[str]]:
    """``text`` without the parts' matches in its head (its first ``budget`` characters, cut
    back to a line's end; all of it when shorter), and the names of the parts that removed
    something."""
    if len(text) <= budget:
        head, tail = text, ""
    else:
        end = text.rfind("\n", 0, budget) + 1  # 0: no line ends in the window
        head, tail = text[:end], text[end:]
    found: set[str] = set()
    for part in parts:
        if not head or (part.needle is not None and part.needle not in head):
            continue
        stripped = part.pattern.sub("", head)
        if stripped != head:
            found.add(part.name)
            head = stripped
    return (head + tail if found else text), found


def _strip_content(content: Any, parts: Sequence[VolatilePart]) -> tuple[Any, set[str]]:
    """A message's content (a string, or a list of parts whose text parts share one
    ``MAX_SCAN_CHARS`` window) without the parts' matches, and their names."""
    if isinstance(content, str):
        return strip_text(content, parts)
    if not isinstance(content, list):
        return content, set()
    budget = MAX_SCAN_CHARS
    found: set[str] = set()
    out: list[Any] = []
    for item in content:
        text = item.get("text") if isinstance(item, Mapping) else None
        if not isinstance(text, str) or budget <= 0:
            out.append(item)
            continue
        stripped, names = strip_text(text, parts, budget)
        budget -= min(len(text), budget)
        found |= names
        out.append({**item, "text": stripped} if names else item)
    return (out if found else content), found


def normalise(
    messages: Sequence[Message], parts: Sequence[VolatilePart]
) -> NormalisedPrompt | None:
    """The messages with the volatile parts taken out of their system text (module
    docstring), or None when nothing was: the changed messages are copies, the others the
    same objects."""
    out: list[Message] | None = None
    found: set[str] = set()
    first = 0
    seen = 0
    for i, message in enumerate(messages):
        if message.get("role") not in SYSTEM_ROLES:
            continue
        seen += 1
        if seen > MAX_SYSTEM_MESSAGES:
            break
        content, names = _strip_content(message.get("content"), parts)
        if not names:
            continue
        if out is None:
            out, first = list(messages), i
        out[i] = {**message, "content": content}
        found |= names
    if out is None:
        return None
    named = tuple(p.name for p in parts if p.name in found)
    return NormalisedPrompt(named, tuple(out), first)
