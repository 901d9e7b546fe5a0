"""What one request may hold, so that no request up to the body limit holds the proxy's event
loop for more than 100 ms: each bound is checked before the work it bounds, and past it the
client gets a 400 in its API's own envelope (docs/operations.md, "Bounds, quotas and
timeouts", has bench/loop_lag.py's figures: at most ~65 ms on the 2-core box).

What a call costs the loop grows with what its body holds: the JSON decoding (msgspec), the
dialect's pydantic validation, the ``Call`` it becomes (tool inputs dumped to JSON), the
conversation's fingerprints (proxy/sessions/conversation.py: canonical JSON of tool calls,
SHA-256), the token estimates, the schema check (core/schema_instance.py, its own budget), the
simulated engine's reply (stop sequences looked for), a stored response's JSON. Before these
bounds, 8 MiB bodies (``TALARIA_MAX_REQUEST_BYTES``) of tiny elements held the loop for
0.5–2.3 s, and 4 million token ids sent as a prompt for 32 s (one validation error each).
The work is bounded, not moved to a thread: msgspec's decoder, pydantic's validator and
``json.dumps`` hold the GIL for a whole body, so a worker thread would block the loop as long.
The counts are read where it is cheap, before the work:

- **Objects, arrays and object members** (``MAX_BODY_STRUCTURE``), before the body is
  decoded: its ``{``, ``[`` and ``:`` bytes, counted in C (~10 ms for 8 MiB) without parsing,
  so those inside strings count too. Decoding costs 40–180 ns an object, an array or a
  member (a new key hashed into its object; the collector's passes over new lists), and the
  stages after it up to ~1 µs a member of a tool's input or schema (``json.dumps``, canonical
  JSON, pydantic's copy): ~55 ms at the bound. A string or a number in an array decodes in
  5–10 ns: ~40 ms for 8 MiB of them.
- **Items** (``MAX_REQUEST_ITEMS``), before validation: the messages (``messages``, Responses'
  ``input`` items, Anthropic's ``system`` blocks), their content parts, tool calls, a
  ``tool_result`` block's own content and a reasoning item's summary parts, together. Each
  costs 2–6 µs through validation, conversion and fingerprinting: ~50 ms at the bound.
- **Tools** (``MAX_TOOLS``), before validation: the ``tools`` entries and the tools of a
  namespace group (Codex's). Each costs ~10 µs before its schema is built: ~5 ms at the bound.
- **Entries of every other top-level list or object** (``MAX_FIELD_ENTRIES``): ``stop``,
  ``stop_sequences``, ``logit_bias``, ``metadata``, a ``prompt`` list, unknown fields. Each
  element of a list a field rejects becomes a validation error, and the simulated engine looks
  for every stop sequence in its reply.

The length of text (a long message, a long tool description) is not bounded here: it costs
1–5 ns a byte (hashing, encoding, counting), 30–60 ms for 8 MiB, and a prompt past the
model's context window is refused anyway.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from talaria.proxy.contract.errors import ApiError, bad_request

MAX_BODY_STRUCTURE = 65_536
"""The most ``{``, ``[`` and ``:`` bytes a request body may hold (in strings too). An agent's
call holds far fewer (est.): ~5 objects and arrays and ~10 members a message (the message,
its blocks, a tool call's input), ~5,000 for the ~350 calls of a conversation that fills the
catalog's largest context window (262,144 tokens, ~1 MiB); the text of that window, if all
source code, adds 1.2–2.4% of its bytes (brackets 0.5–1.1%, colons 0.7–1.6%: this
repository's Python, 4 MB: 0.52% and 0.96%; 8 MB of JavaScript: 1.04% and 0.70%; 8 MB of
JSON files: 0.77% and 1.62%), ~25,000. A prompt of over ~3 MiB of code (a model with a
window of a million tokens behind a runtime) can pass the bound and be refused."""

MAX_REQUEST_ITEMS = 8_192
"""The most messages, content parts and tool calls one request may hold together. An agent
conversation that fills the catalog's largest context window (262,144 tokens) at the 740–1,100
tokens an agent call adds (docs/sources.md §2) holds ~240–350 calls; at a message each way and
2–3 parts or tool calls a call, ~2,500 items (est.), under a third of the bound. Anthropic's API
takes up to 100,000 messages (docs/sources.md §10): ~0.5 s of this proxy's loop, at ~5 µs
each."""

MAX_TOOLS = 512
"""The most tools one request may offer: four times OpenAI's documented 128 for chat
completions (docs/sources.md §10), room for agents with many MCP servers; the agents send 10–12
(docs/sources.md §9). 512 tiny tools cost the loop ~5 ms; their schemas share one budget
(core/schema_instance.py)."""

MAX_FIELD_ENTRIES = 4_096
"""The most entries of any other top-level list or object of a body (``stop``, ``logit_bias``,
``metadata``, a ``prompt`` list, an unknown field): a thousand times OpenAI's 4 stop sequences
and 256 times its 16 metadata pairs (docs/sources.md §10)."""

ITEM_FIELDS = ("messages", "input", "system")
"""Top-level fields whose entries are items: messages, Responses' input items, system blocks."""

NESTED_ITEM_FIELDS = ("content", "tool_calls", "summary", "output")
"""Fields of an item whose entries are items too: content parts and blocks, tool calls, a
reasoning item's summary, a function call's output parts (and, one level down, a
``tool_result`` block's content)."""

NESTED_LEVELS = 2
"""How far below a top-level item nested items are counted: a message's blocks, and a
``tool_result`` block's own content blocks."""


def check_structure(body: bytes) -> None:
    """A 400 (``request_too_complex``) for a body with more than ``MAX_BODY_STRUCTURE``
    objects, arrays and object members, counted as ``{``, ``[`` and ``:`` bytes (those in
    strings too)."""
    found = body.count(b"{") + body.count(b"[") + body.count(b":")
    if found > MAX_BODY_STRUCTURE:
        raise bad_request(
            f"The request body holds more than {MAX_BODY_STRUCTURE:,} objects, arrays and "
            f"object members (it has {found:,} '{{', '[' and ':' characters, those in its "
            "strings counted too).",
            code="request_too_complex",
        )


def check_request(body: Mapping[str, Any]) -> None:
    """A 400 for a decoded body past a bound of the module docstring (before it is validated):
    ``too_many_tools``, ``too_many_entries`` or ``too_many_items``, naming the field."""
    tools = body.get("tools")
    if isinstance(tools, list) and count_tools(tools) > MAX_TOOLS:
        raise bad_request(
            f"The request offers more than {MAX_TOOLS:,} tools.",
            param="tools",
            code="too_many_tools",
        )
    for key, value in body.items():
        bounded_apart = isinstance(value, list) and (key in ITEM_FIELDS or key == "tools")
        if not bounded_apart and isinstance(value, list | dict) and len(value) > MAX_FIELD_ENTRIES:
            raise bad_request(
                f"{key} holds more than {MAX_FIELD_ENTRIES:,} entries.",
                param=key,
                code="too_many_entries",
            )
    fields = [key for key in ITEM_FIELDS if isinstance(body.get(key), list)]
    if sum(count_items(body[key], MAX_REQUEST_ITEMS) for key in fields) > MAX_REQUEST_ITEMS:
        raise too_many_items(max(fields, key=lambda key: len(body[key])))


def check_items(items: Sequence[Any], param: str) -> None:
    """A 400 (``too_many_items``, naming ``param``) when ``items`` hold more than
    ``MAX_REQUEST_ITEMS`` items with their nested ones (a Responses call's stored history
    and its own input, together)."""
    if count_items(items, MAX_REQUEST_ITEMS) > MAX_REQUEST_ITEMS:
        raise too_many_items(param)


def too_many_items(param: str) -> ApiError:
    """The 400 of a request past ``MAX_REQUEST_ITEMS``."""
    return bad_request(
        f"The request holds more than {MAX_REQUEST_ITEMS:,} messages, content parts and tool "
        "calls together.",
        param=param,
        code="too_many_items",
    )


def count_items(items: Sequence[Any], limit: int) -> int:
    """``items`` and their nested items (``NESTED_ITEM_FIELDS``, ``NESTED_LEVELS`` deep); the
    count stops once it passes ``limit``, so it visits at most ``limit`` items."""
    total = len(items)
    level: Sequence[Any] = items
    for _ in range(NESTED_LEVELS):
        below: list[Any] = []
        for item in level:
            if total > limit:
                return total
            if not isinstance(item, dict):
                continue
            for field in NESTED_ITEM_FIELDS:
                nested = item.get(field)
                if isinstance(nested, list):
                    total += len(nested)
                    below.extend(nested[: limit + 1])
        level = below
    return total


def count_tools(tools: Sequence[Any]) -> int:
    """The entries of ``tools`` and the tools of namespace groups among them."""
    total = len(tools)
    for tool in tools[: MAX_TOOLS + 1]:
        if total > MAX_TOOLS:
            break
        if isinstance(tool, dict) and isinstance(tool.get("tools"), list):
            total += len(tool["tools"])
    return total
