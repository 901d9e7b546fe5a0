"""Each dialect round-trips: the reply it renders, sent back the way that API's clients send a
reply back, parses to the same conversation message — so the next call finds its session —
and a request parses to the normalized call routing and the runtime see."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from talaria.core.calls import ModelOutput, ToolCall, ToolChoice
from talaria.core.types import CallResult, KvSource
from talaria.proxy.contract.calls import CallOutcome
from talaria.proxy.dialects.anthropic.parse import parse_messages
from talaria.proxy.dialects.anthropic.render import message
from talaria.proxy.dialects.chat.parse import parse_chat
from talaria.proxy.dialects.chat.render import chat_completion
from talaria.proxy.dialects.responses.parse import messages_of
from talaria.proxy.dialects.responses.render import output_items
from talaria.proxy.sessions.conversation import fingerprint

_json_objects = st.dictionaries(
    st.text("abcdef_", min_size=1, max_size=6),
    st.one_of(st.integers(-5, 5), st.text(max_size=8), st.booleans()),
    max_size=3,
)
_outputs = st.builds(
    ModelOutput,
    st.text(max_size=40),
    st.text(max_size=20),
    st.lists(
        st.builds(
            ToolCall,
            st.text("abcdef0123456789", min_size=4, max_size=8).map(lambda s: "call_" + s),
            st.sampled_from(["ls", "read_file", "glob"]),
            _json_objects.map(json.dumps),
        ),
        max_size=2,
        unique_by=lambda c: c.id,
    ).map(tuple),
    st.sampled_from(["stop", "length", "tool_calls"]),
)


def _outcome(output: ModelOutput) -> CallOutcome:
    result = CallResult(
        "r1", "s", "m", "n0", 10, 0, 5, 0.0, 0.0, 0.1, 0.2, KvSource.NEW, 0.0, 0, False, output
    )
    return CallOutcome(result, "n0", output)


def _expected(output: ModelOutput) -> bytes:
    return fingerprint(output.as_message()).digest


@given(_outputs)
def test_chat_round_trip(output: ModelOutput) -> None:
    reply = chat_completion(_outcome(output), "r1", "m", 0)
    message = json.loads(json.dumps(reply["choices"][0]["message"]))
    parsed = parse_chat({"model": "m", "messages": [{"role": "user", "content": "go"}, message]})
    assert parsed.messages is not None
    assert fingerprint(parsed.messages[1]).digest == _expected(output)


@given(_outputs)
def test_anthropic_round_trip(output: ModelOutput) -> None:
    reply = json.loads(json.dumps(message(_outcome(output), "r1", "m")))
    parsed = parse_messages(
        {
            "model": "m",
            "max_tokens": 10,
            "messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": reply["content"]},
            ],
        }
    )
    assert parsed.messages is not None
    assert fingerprint(parsed.messages[1]).digest == _expected(output)


@given(_outputs)
def test_responses_round_trip(output: ModelOutput) -> None:
    items = json.loads(json.dumps(output_items(output, "r1")))
    messages = messages_of(None, [{"role": "user", "content": "go"}, *items])
    assert fingerprint(messages[1]).digest == _expected(output)


def test_anthropic_request_normalized() -> None:
    call = parse_messages(
        {
            "model": "m",
            "max_tokens": 2048,
            "system": [{"type": "text", "text": "be brief"}, {"type": "text", "text": "be kind"}],
            "stop_sequences": ["END"],
            "top_k": 5,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "tool_choice": {"type": "any"},
            "tools": [
                {"name": "ls", "input_schema": {"type": "object"}},
                {"type": "web_search_20250305", "name": "web_search"},
            ],
            "messages": [
                {"role": "user", "content": "list"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "x"},
                        {"type": "text", "text": "ok"},
                        {"type": "tool_use", "id": "t1", "name": "ls", "input": {"a": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "a.py"},
                        {"type": "text", "text": "and?"},
                    ],
                },
            ],
        }
    )
    assert call.messages == (
        {"role": "system", "content": "be brief\nbe kind"},
        {"role": "user", "content": "list"},
        {
            "role": "assistant",
            "content": "ok",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "ls", "arguments": '{"a": 1}'},
                }
            ],
            "reasoning_content": "hm",
        },
        {"role": "tool", "tool_call_id": "t1", "content": "a.py"},
        {"role": "user", "content": "and?"},
    )
    assert [t.name for t in call.tools] == ["ls"]  # the server tool is left out
    assert call.tool_choice == ToolChoice("required") and call.reasoning_effort == "medium"
    assert call.sampling.stop == ("END",) and call.sampling.top_k == 5


def test_responses_items_merge_into_turns() -> None:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "hm"}]},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "ok"}],
        },
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "ls", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a"},
        {"type": "function_call_output", "call_id": "c2", "output": "b"},
        {"type": "web_search_call", "id": "ws"},  # a built-in tool's item: skipped
    ]
    messages = messages_of("be brief", items)
    assert [m["role"] for m in messages] == [
        "system",
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
    ]
    turn = messages[3]
    assert turn["content"] == "ok" and turn["reasoning_content"] == "hm"
    assert [c["id"] for c in turn["tool_calls"]] == ["c1", "c2"]


def test_chat_request_normalized() -> None:
    call = parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "rules"}]},
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "function": {"name": "ls", "arguments": {"a": 1}}}],
                },
            ],
            "stop": "END",
            "seed": 3,
            "temperature": 0,
            "response_format": {"type": "json_object"},
            "tools": [{"type": "function", "function": {"name": "ls"}}],
            "tool_choice": {"type": "function", "function": {"name": "ls"}},
            "max_completion_tokens": 7,
        }
    )
    assert call.messages is not None
    assert call.messages[0] == {"role": "system", "content": "rules"}
    assert call.messages[2]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    assert call.tool_choice == ToolChoice("named", "ls") and call.max_output_tokens == 7
    assert call.sampling.stop == ("END",) and call.sampling.seed == 3
    assert call.sampling.response_format == {"type": "json_object"}
