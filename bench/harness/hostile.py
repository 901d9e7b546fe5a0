"""Hostile request bodies for each API of the proxy, filled to its body limit: the shapes
bench/loop_lag.py times and tests/integration/test_loop_lag.py sends.

A :class:`Shape` builds a body of ``n`` elements of one kind (tiny messages, content parts,
tools, stop sequences, ...); :func:`fill` finds the largest ``n`` whose JSON fits a byte budget.
Every element of a shape encodes to the same number of bytes (indices are zero-padded), so a
body's size is ``a + b·n`` and two small encodings give ``n`` without a search. Fixed shapes
(``scaled=False``) ignore ``n``: the finding of 1,000 tools each just under the old per-tool
schema budget, a schema bomb, a deeply nested value.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
}
"""Each API's call route."""

NEAR_BUDGET_ITEMS = 4_000
"""``minItems`` of each tool of the finding: just under the old per-tool budget (4,096 values)."""

NESTING_DEPTH = 900
"""A nested value this deep: msgspec, the proxy's body parser, refuses about 1,000."""


@dataclass(frozen=True)
class Shape:
    """One kind of hostile body: ``build(model, n)`` is the body with ``n`` elements."""

    api: str
    name: str
    build: Callable[[str, int], dict[str, Any]]
    scaled: bool = True
    """False: a fixed body (``n`` is ignored)."""

    @property
    def path(self) -> str:
        """The API's route."""
        return PATHS[self.api]

    @property
    def label(self) -> str:
        """``api: name``."""
        return f"{self.api}: {self.name}"


def encode(body: dict[str, Any]) -> bytes:
    """The body as compact JSON."""
    return json.dumps(body, separators=(",", ":")).encode()


def fill(shape: Shape, model: str, max_bytes: int) -> tuple[bytes, int]:
    """(the body of ``shape`` with the most elements that fit in ``max_bytes``, that count).
    A fixed shape's body is returned as it is."""
    if not shape.scaled:
        return encode(shape.build(model, 1)), 1
    one, two = len(encode(shape.build(model, 1))), len(encode(shape.build(model, 2)))
    n = max(1, 1 + (max_bytes - one) // (two - one))
    body = encode(shape.build(model, n))
    while len(body) > max_bytes and n > 1:  # element sizes are constant: at most once
        n -= 1
        body = encode(shape.build(model, n))
    return body, n


def largest_accepted(
    shape: Shape, model: str, most: int, accepts: Callable[[bytes], bool]
) -> tuple[bytes, int] | None:
    """(the body of ``shape`` with the most elements, at most ``most``, that ``accepts``
    takes, that count), by bisection; None when even one element is refused."""
    low, high = 0, most  # accepts(low) holds (or low is 0); accepts(high + 1) does not
    while low < high:
        mid = (low + high + 1) // 2
        if accepts(encode(shape.build(model, mid))):
            low = mid
        else:
            high = mid - 1
    return (encode(shape.build(model, low)), low) if low else None


# -- the elements ---------------------------------------------------------------------------

HI = [{"role": "user", "content": "hi"}]


def near_budget_schema() -> dict[str, Any]:
    """An object whose required array asks for ``NEAR_BUDGET_ITEMS`` integers (~190 bytes)."""
    xs = {"type": "array", "minItems": NEAR_BUDGET_ITEMS, "items": {"type": "integer"}}
    return {"type": "object", "required": ["xs"], "properties": {"xs": xs}}


def schema_bomb() -> dict[str, Any]:
    """Nested ``minItems`` 5,000 × 5,000: 25 million values without a budget."""
    inner = {"type": "array", "minItems": 5000, "items": {"type": "integer"}}
    return {"type": "array", "minItems": 5000, "items": inner}


def nested(depth: int) -> Any:
    """``[[[…]]]``, ``depth`` arrays deep."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _chat(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": HI, **fields}


def _messages(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 16, "messages": HI, **fields}


def _responses(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "input": "hi", **fields}


def _chat_tool(name: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def _members(n: int) -> dict[str, int]:
    """An object of ``n`` (at most 16^5) members of 10 bytes each."""
    return {f"{i:05x}": 1 for i in range(n)}


def _user_json(n: int) -> str:
    """A Claude Code ``metadata.user_id`` that is JSON holding ``n`` empty arrays."""
    return '{"session_id":"s","junk":[' + ",".join(["[]"] * n) + "]}"


def _at_bounds(model: str, api: str) -> dict[str, Any]:
    """A body at every bound of proxy/callpath/bounds.py at once: as many tiny messages as a
    request may hold items, as many tiny tools as it may offer, the most entries of two other
    fields, and one tool call whose arguments take the objects, arrays and members left."""
    from talaria.proxy.callpath.bounds import (
        MAX_BODY_STRUCTURE,
        MAX_FIELD_ENTRIES,
        MAX_REQUEST_ITEMS,
        MAX_TOOLS,
    )

    entries = [f"{i:07d}" for i in range(MAX_FIELD_ENTRIES)]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"{i:07d}"} for i in range(MAX_REQUEST_ITEMS - 3)
    ]
    names = [f"t{i:07d}" for i in range(MAX_TOOLS)]
    body: dict[str, Any]
    if api == "chat":
        body = {"model": model, "messages": messages, "tools": [_chat_tool(n) for n in names],
                "stop": entries, "logit_bias": dict.fromkeys(entries, 1)}  # fmt: skip
    elif api == "messages":
        tools = [{"name": n, "input_schema": {"type": "object"}} for n in names]
        body = {"model": model, "max_tokens": 16, "messages": messages, "tools": tools,
                "stop_sequences": entries, "metadata": dict.fromkeys(entries, "x")}  # fmt: skip
    else:
        tools = [{"type": "function", "name": n} for n in names]
        body = {"model": model, "input": messages, "tools": tools, "include": entries,
                "metadata": dict.fromkeys(entries, "x")}  # fmt: skip
    raw = encode(body)
    left = MAX_BODY_STRUCTURE - sum(raw.count(c) for c in (b"{", b"[", b":")) - 16
    arguments = _members(left)
    if api == "chat":
        function = {"name": "ls", "arguments": json.dumps(arguments)}
        call = {"id": "c", "type": "function", "function": function}
        messages.append({"role": "assistant", "tool_calls": [call]})
    elif api == "messages":
        use = {"type": "tool_use", "id": "u", "name": "ls", "input": arguments}
        messages.append({"role": "assistant", "content": [use]})
    else:
        messages.append({"type": "function_call", "call_id": "c", "name": "ls",
                         "arguments": json.dumps(arguments)})  # fmt: skip
    messages.append({"role": "user", "content": "go on"})
    return body


AT_BOUNDS = "every bound at once"
FINDING = "1,000 tools near the schema budget"
TOGETHER = "400 tools near the schema budget"
"""Under the cap on tools: refused by the request's one schema budget."""

SHAPES: tuple[Shape, ...] = (
    # chat completions
    Shape("chat", FINDING, lambda m, n: _chat(
        m, tools=[_chat_tool(f"c{i:04d}", near_budget_schema()) for i in range(1000)]), False),
    Shape("chat", AT_BOUNDS, lambda m, n: _at_bounds(m, "chat"), False),
    Shape("chat", TOGETHER, lambda m, n: _chat(
        m, tools=[_chat_tool(f"d{i:04d}", near_budget_schema()) for i in range(400)]), False),
    Shape("chat", "tiny messages", lambda m, n: {
        "model": m, "messages": [{"role": "user", "content": f"{i:07d}"} for i in range(n)]}),
    Shape("chat", "one long message", lambda m, n: {
        "model": m, "messages": [{"role": "user", "content": "word " * n}]}),
    Shape("chat", "content parts", lambda m, n: {"model": m, "messages": [{
        "role": "user", "content": [{"type": "text", "text": f"{i:07d}"} for i in range(n)]}]}),
    Shape("chat", "tool calls", lambda m, n: {"model": m, "messages": [*HI, {
        "role": "assistant", "tool_calls": [{"id": f"c{i:07d}", "type": "function", "function": {
            "name": "ls", "arguments": "{}"}} for i in range(n)]}]}),
    Shape("chat", "tool-call arguments", lambda m, n: {"model": m, "messages": [*HI, {
        "role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "ls", "arguments": json.dumps(_members(n))}}]}]}),
    Shape("chat", "tool parameters", lambda m, n: _chat(
        m, tools=[_chat_tool("t", {"type": "object", "properties": _members(n)})])),
    Shape("chat", "tiny tools", lambda m, n: _chat(
        m, tools=[_chat_tool(f"t{i:07d}") for i in range(n)])),
    Shape("chat", "long tool description", lambda m, n: _chat(m, tools=[{
        "type": "function", "function": {"name": "t", "description": "word " * n}}])),
    Shape("chat", "stop sequences", lambda m, n: _chat(m, stop=[f"{i:07d}" for i in range(n)])),
    Shape("chat", "logit_bias", lambda m, n: _chat(
        m, logit_bias={f"{i:07d}": 1 for i in range(n)})),
    Shape("chat", "empty arrays", lambda m, n: _chat(m, junk=[[] for _ in range(n)])),
    Shape("chat", "deep nesting", lambda m, n: _chat(m, junk=nested(NESTING_DEPTH)), False),
    Shape("chat", "deep tool schema", lambda m, n: _chat(
        m, tools=[_chat_tool("deep", {"type": "object", "x": nested(NESTING_DEPTH)})]), False),
    Shape("chat", "response-format bomb", lambda m, n: _chat(m, response_format={
        "type": "json_schema", "json_schema": {"name": "o", "schema": schema_bomb()}}), False),
    # completions
    Shape("completions", "prompt list", lambda m, n: {
        "model": m, "prompt": [f"{i:07d}" for i in range(n)]}),
    Shape("completions", "token ids", lambda m, n: {"model": m, "prompt": [1] * n}),
    Shape("completions", "long prompt", lambda m, n: {"model": m, "prompt": "word " * n}),
    # Anthropic messages
    Shape("messages", FINDING, lambda m, n: _messages(m, tools=[
        {"name": f"a{i:04d}", "input_schema": near_budget_schema()} for i in range(1000)]), False),
    Shape("messages", AT_BOUNDS, lambda m, n: _at_bounds(m, "messages"), False),
    Shape("messages", TOGETHER, lambda m, n: _messages(m, tools=[
        {"name": f"b{i:04d}", "input_schema": near_budget_schema()} for i in range(400)]), False),
    Shape("messages", "tiny messages", lambda m, n: {"model": m, "max_tokens": 16, "messages": [
        {"role": "user", "content": f"{i:07d}"} for i in range(n)]}),
    Shape("messages", "content blocks", lambda m, n: _messages(m, messages=[{
        "role": "user", "content": [{"type": "text", "text": f"{i:07d}"} for i in range(n)]}])),
    Shape("messages", "tool results", lambda m, n: _messages(m, messages=[{
        "role": "user", "content": [{"type": "tool_result", "tool_use_id": f"u{i:07d}",
                                     "content": [{"type": "text", "text": "x"}]}
                                    for i in range(n)]}])),
    Shape("messages", "tool_use input", lambda m, n: _messages(m, messages=[*HI, {
        "role": "assistant", "content": [
            {"type": "tool_use", "id": "u", "name": "ls", "input": _members(n)}]}])),
    Shape("messages", "tiny tools", lambda m, n: _messages(m, tools=[
        {"name": f"t{i:07d}", "input_schema": {"type": "object"}} for i in range(n)])),
    Shape("messages", "system blocks", lambda m, n: _messages(m, system=[
        {"type": "text", "text": f"{i:07d}"} for i in range(n)])),
    Shape("messages", "stop sequences", lambda m, n: _messages(
        m, stop_sequences=[f"{i:07d}" for i in range(n)])),
    Shape("messages", "user_id of JSON", lambda m, n: _messages(
        m, metadata={"user_id": _user_json(n)})),
    # OpenAI Responses
    Shape("responses", FINDING, lambda m, n: _responses(m, tools=[
        {"type": "function", "name": f"r{i:04d}", "parameters": near_budget_schema()}
        for i in range(1000)]), False),
    Shape("responses", AT_BOUNDS, lambda m, n: _at_bounds(m, "responses"), False),
    Shape("responses", TOGETHER, lambda m, n: _responses(m, tools=[
        {"type": "function", "name": f"s{i:04d}", "parameters": near_budget_schema()}
        for i in range(400)]), False),
    Shape("responses", "input items", lambda m, n: {"model": m, "input": [
        {"role": "user", "content": f"{i:07d}"} for i in range(n)]}),
    Shape("responses", "input parts", lambda m, n: {"model": m, "input": [{
        "role": "user", "content": [{"type": "input_text", "text": f"{i:07d}"}
                                    for i in range(n)]}]}),
    Shape("responses", "function calls", lambda m, n: {"model": m, "input": [*HI, *[
        {"type": "function_call", "call_id": f"c{i:07d}", "name": "ls", "arguments": "{}"}
        for i in range(n)]]}),
    Shape("responses", "function-call arguments", lambda m, n: {"model": m, "input": [*HI, {
        "type": "function_call", "call_id": "c", "name": "ls", "arguments": _members(n)}]}),
    Shape("responses", "tiny tools", lambda m, n: _responses(m, tools=[
        {"type": "function", "name": f"t{i:07d}"} for i in range(n)])),
    Shape("responses", "namespace of tools", lambda m, n: _responses(m, tools=[
        {"type": "namespace", "name": "ns", "tools": [
            {"type": "function", "name": f"t{i:07d}"} for i in range(n)]}])),
    Shape("responses", "long instructions", lambda m, n: _responses(m, instructions="word " * n)),
    Shape("responses", "text-format bomb", lambda m, n: _responses(m, text={"format": {
        "type": "json_schema", "name": "o", "schema": schema_bomb()}}), False),
)  # fmt: skip
"""Every shape, by API."""
