"""Reading a reply's ending from the JSON the OpenAI client parses (any API, streamed or not).

:func:`finish_of` tells whether a payload is the end of a reply and whether that reply asks
the client to run tools: chat completions (``finish_reason``), completions, and the Responses
API (``output`` items of the client-side tool kinds; streamed as ``response.completed``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TOOL_FINISH_REASONS = frozenset({"tool_calls", "function_call"})
CLIENT_TOOL_ITEMS = frozenset(
    {
        "function_call",
        "custom_tool_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "computer_call",
    }
)
"""Responses API output items that the client must run (the server runs the others)."""
_CHOICE_OBJECTS = frozenset({"chat.completion", "chat.completion.chunk", "text_completion"})
_RESPONSE_END_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
_RESPONSE_END_STATES = frozenset({"completed", "incomplete", "failed", "cancelled"})


def finish_of(data: object) -> bool | None:
    """None: ``data`` does not end a reply; True: it ends one with tool calls; False: it ends
    one otherwise."""
    if not isinstance(data, Mapping):
        return None
    inner = data.get("data")
    if "event" in data and isinstance(inner, Mapping):  # a synthesized {"event", "data"} pair
        data = inner
    kind = data.get("object")
    if kind in _CHOICE_OBJECTS:
        reasons = [
            c.get("finish_reason") for c in data.get("choices") or [] if isinstance(c, Mapping)
        ]
        reasons = [r for r in reasons if r]
        if not reasons:
            return None
        return any(r in TOOL_FINISH_REASONS for r in reasons)
    if data.get("type") in _RESPONSE_END_EVENTS and isinstance(data.get("response"), Mapping):
        return _response_tools(data["response"])
    if kind == "response" and data.get("status") in _RESPONSE_END_STATES:
        return _response_tools(data)
    return None


def _response_tools(response: Mapping[str, Any]) -> bool:
    items = response.get("output") or []
    return any(isinstance(i, Mapping) and i.get("type") in CLIENT_TOOL_ITEMS for i in items)


def offers_tools(body: object) -> bool:
    """Whether a request body offers tools the reply may call."""
    if not isinstance(body, Mapping):
        return False
    return bool(body.get("tools")) and body.get("tool_choice") != "none"
