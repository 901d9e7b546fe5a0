"""The fields of Responses API input items that the proxy keeps: each item type's fields as
OpenAI's Responses API defines them; every other field is dropped when the request is parsed,
so a stored response (proxy/dialects/responses/store.py) never holds what no client or model reads.

Dropped, not refused: the parser (responses.py ``messages_of``) reads only fields kept here,
so the messages a call sends the model are the same with or without the dropped ones (a
seeded test compares them), and a client that sends extra fields (SDKs add their own) keeps
working. Kept per item kind (``item_kind``: its ``type``, or ``message`` for an item with a
``role`` and no type):

- ``message``: ``type``, ``id``, ``role``, ``content``, ``status``;
- ``function_call``: ``type``, ``id``, ``call_id``, ``name``, ``arguments``, ``status``;
- ``function_call_output``: ``type``, ``id``, ``call_id``, ``output``, ``status``;
- ``reasoning``: ``type``, ``id``, ``summary``, ``content``, ``encrypted_content``,
  ``status``;
- any other kind (built-in tools' items, compaction, ``item_reference``, which the parser
  skips or refuses): ``type`` (a string), ``id``, ``status`` only: nothing else of them
  reaches the model.

``content``, ``summary`` and ``output`` are text (a string, kept) or a list of parts: each
part keeps its ``type`` and the fields :data:`PART_FIELDS` defines for that type (a part of a
type not listed keeps its ``type``, a part without a string ``type`` nothing); list elements
that are not objects, and values of other types, are dropped (the parser reads neither).
Field values are kept as they are: their bytes count against the tenant's storage quota
(proxy/dialects/responses/quota.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text", "refusal")
"""Part types whose ``text`` is the message's text (the parser reads it)."""

ITEM_FIELDS: dict[str, tuple[str, ...]] = {
    "message": ("id", "role", "content", "status"),
    "function_call": ("id", "call_id", "name", "arguments", "status"),
    "function_call_output": ("id", "call_id", "output", "status"),
    "reasoning": ("id", "summary", "content", "encrypted_content", "status"),
}
"""Fields kept besides ``type``, per item kind."""
OTHER_ITEM_FIELDS = ("id", "status")
TEXT_FIELDS = ("content", "summary", "output")
"""Fields holding text or a list of parts."""

PART_FIELDS: dict[str, tuple[str, ...]] = {
    "input_text": ("text",),
    "output_text": ("text", "annotations", "logprobs"),
    "text": ("text",),
    "summary_text": ("text",),
    "reasoning_text": ("text",),
    "refusal": ("refusal", "text"),  # ``text``: the parser reads it as a text part's
    "input_image": ("image_url", "file_id", "detail"),
    "input_file": ("file_id", "file_data", "file_url", "filename"),
    "input_audio": ("input_audio",),
}
"""Fields kept besides ``type``, per content part type."""


def item_kind(item: Mapping[str, Any]) -> Any:
    """The item's kind as the parser reads it: its ``type``, else ``message`` when it has a
    ``role``, else None."""
    return item.get("type") or ("message" if "role" in item else None)


def _part(part: Mapping[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if not isinstance(kind, str):  # the parser reads no part without a string type
        return {}
    out: dict[str, Any] = {"type": kind}
    out.update((name, part[name]) for name in PART_FIELDS.get(kind, ()) if name in part)
    return out


def _text_value(value: Any) -> str | list[dict[str, Any]] | None:
    """A text field: a string as it is, a list as its object parts (kept fields), else
    None (dropped)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return [_part(p) for p in value if isinstance(p, Mapping)]
    return None


def stored_item(item: Mapping[str, Any]) -> dict[str, Any]:
    """``item`` with only the fields its kind defines (see the module docstring)."""
    kind = item_kind(item)
    known = ITEM_FIELDS.get(kind) if isinstance(kind, str) else None
    out: dict[str, Any] = {}
    if known is not None:
        out["type"] = kind
    elif isinstance(item.get("type"), str):
        out["type"] = item["type"]
    for name in known if known is not None else OTHER_ITEM_FIELDS:
        if name not in item:
            continue
        value = _text_value(item[name]) if name in TEXT_FIELDS else item[name]
        if value is not None:
            out[name] = value
    return out
