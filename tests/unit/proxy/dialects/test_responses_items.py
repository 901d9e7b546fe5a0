"""Responses API input items keep only the fields their type defines, and the messages the
parser makes of them are the same as of the items as sent."""

from __future__ import annotations

import random
from typing import Any

import pytest

from talaria.proxy.contract.errors import ApiError
from talaria.proxy.dialects.responses.items import (
    ITEM_FIELDS,
    PART_FIELDS,
    TEXT_PARTS,
    stored_item,
)
from talaria.proxy.dialects.responses.parse import messages_of

BLOB = "x" * 64
PART = {"type": "output_text", "text": "ok", "annotations": [], "logprobs": []}


@pytest.mark.parametrize(
    ("item", "kept"),
    [
        (
            {"type": "message", "role": "user", "content": "hi", "junk": BLOB},
            {"type": "message", "role": "user", "content": "hi"},
        ),
        (  # an easy input message (no type) is stored as a message
            {"role": "user", "content": [{"type": "input_text", "text": "hi", "junk": BLOB}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        ),
        (
            {
                "type": "message",
                "id": "m1",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {**PART, "x": 0},
                    {"type": "refusal", "refusal": "no", "extra": BLOB},
                    {"type": "mystery", "payload": BLOB},
                    {"no_type": BLOB},
                    BLOB,
                ],
            },
            {
                "type": "message",
                "id": "m1",
                "role": "assistant",
                "status": "completed",
                "content": [
                    PART,
                    {"type": "refusal", "refusal": "no"},
                    {"type": "mystery"},
                    {},
                ],
            },
        ),
        (
            {"type": "message", "role": "user", "content": {"not": "text"}},
            {"type": "message", "role": "user"},
        ),
        (
            {"type": "function_call", "call_id": "c", "name": "ls", "arguments": "{}", "z": BLOB},
            {"type": "function_call", "call_id": "c", "name": "ls", "arguments": "{}"},
        ),
        (
            {
                "type": "function_call_output",
                "call_id": "c",
                "output": [{"type": "input_text", "text": "a", "junk": BLOB}],
                "junk": BLOB,
            },
            {
                "type": "function_call_output",
                "call_id": "c",
                "output": [{"type": "input_text", "text": "a"}],
            },
        ),
        (
            {
                "type": "reasoning",
                "id": "rs",
                "summary": [{"type": "summary_text", "text": "hm", "junk": BLOB}],
                "encrypted_content": "enc",
                "junk": BLOB,
            },
            {
                "type": "reasoning",
                "id": "rs",
                "summary": [{"type": "summary_text", "text": "hm"}],
                "encrypted_content": "enc",
            },
        ),
        (  # a built-in tool's item keeps its envelope only
            {"type": "web_search_call", "id": "ws", "status": "completed", "action": BLOB},
            {"type": "web_search_call", "id": "ws", "status": "completed"},
        ),
        ({"type": 7, "id": "odd", "blob": BLOB}, {"id": "odd"}),
        ({"blob": BLOB}, {}),
    ],
)
def test_unknown_fields_are_dropped(item: dict[str, Any], kept: dict[str, Any]) -> None:
    assert stored_item(item) == kept


def test_every_text_part_keeps_its_text() -> None:
    """The parser reads ``text`` of these part types: dropping it would change the messages."""
    assert all("text" in PART_FIELDS[kind] for kind in TEXT_PARTS)


KINDS = [*ITEM_FIELDS, "web_search_call", "item_reference", None]
PARTS = [*PART_FIELDS, "mystery", None]
ROLES = ["user", "assistant", "system", "developer", "tool"]


def _value(rng: random.Random) -> Any:
    return rng.choice(["t", "", 3, None, {"k": "v"}, ["a"], [{"type": "input_text", "text": "n"}]])


def _parts(rng: random.Random) -> Any:
    if rng.random() < 0.2:
        return rng.choice(["plain text", 5, {"type": "input_text", "text": "d"}])
    parts: list[Any] = []
    for _ in range(rng.randrange(4)):
        if rng.random() < 0.1:
            parts.append("loose")
            continue
        part: dict[str, Any] = {"text": rng.choice(["a", "b c", 1]), "junk": _value(rng)}
        kind = rng.choice(PARTS)
        if kind is not None:
            part["type"] = kind
        for name in PART_FIELDS.get(kind or "", ()):
            part.setdefault(name, _value(rng))
        parts.append(part)
    return parts


def _item(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(KINDS)
    item: dict[str, Any] = {"junk": _value(rng)}
    if kind is not None:
        item["type"] = kind
    if kind in (None, "message") or rng.random() < 0.2:
        item["role"] = rng.choice(ROLES[:4] if rng.random() < 0.95 else ROLES)
    for name in ("id", "call_id", "name", "arguments", "status", "encrypted_content"):
        if rng.random() < 0.7:
            item[name] = rng.choice(["x", "c1", "ls", '{"a": 1}', {"a": 1}])
    for name in ("content", "summary", "output"):
        if rng.random() < 0.6:
            item[name] = _parts(rng)
    return item


def _messages(items: list[dict[str, Any]]) -> Any:
    try:
        return messages_of("rules", items)
    except ApiError as exc:
        return ("error", exc.status, exc.param, exc.message)


@pytest.mark.parametrize("seed", range(40))
def test_the_parsed_messages_are_unchanged(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(25):
        items = [_item(rng) for _ in range(rng.randrange(1, 8))]
        assert _messages([stored_item(i) for i in items]) == _messages(items)
