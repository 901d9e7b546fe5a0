"""What one request may hold (proxy/callpath/bounds.py), the edge schema check's one budget per
request (proxy/callpath/schemas.py), and the length past which Claude Code's ``metadata.user_id``
is not parsed: each bound refuses one past it, takes one at it, and reads no more of the body
than it needs to decide."""

from __future__ import annotations

import json
from typing import Any

import pytest

from talaria.core.calls import Call, Sampling, ToolSpec
from talaria.proxy.callpath.bounds import (
    MAX_BODY_STRUCTURE,
    MAX_FIELD_ENTRIES,
    MAX_REQUEST_ITEMS,
    MAX_TOOLS,
    check_items,
    check_request,
    check_structure,
    count_items,
)
from talaria.proxy.callpath.schemas import SchemaCheck
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.sessions.identity import MAX_USER_ID_CHARS, claude_code_session
from tests.support import near_budget

USER = {"role": "user", "content": "hi"}


def _refused(body: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as refused:
        check_request(body)
    assert refused.value.status == 400
    return refused.value


def test_the_structure_of_a_body_is_counted_before_it_is_parsed() -> None:
    at = b"[" + b",".join([b"[]"] * (MAX_BODY_STRUCTURE - 1)) + b"]"
    check_structure(at)
    with pytest.raises(ApiError) as refused:
        check_structure(b'{"a":' + at + b"}")
    assert refused.value.code == "request_too_complex"
    check_structure(b'"' + b"x" * 10_000_000 + b'"')  # text: any length


def test_braces_and_colons_in_strings_count_too() -> None:
    text = json.dumps({"content": "{:" * (MAX_BODY_STRUCTURE // 2)}).encode()
    with pytest.raises(ApiError):
        check_structure(text)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [USER] * (MAX_REQUEST_ITEMS + 1)}, "messages"),
        ({"input": [USER] * (MAX_REQUEST_ITEMS + 1)}, "input"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}] * MAX_REQUEST_ITEMS}]},
         "messages"),
        ({"messages": [{"role": "assistant", "tool_calls": [{}] * MAX_REQUEST_ITEMS}]},
         "messages"),
        ({"messages": [{"role": "user", "content": [
            {"type": "tool_result", "content": [{"type": "text"}] * (MAX_REQUEST_ITEMS - 1)}]}]},
         "messages"),
        ({"system": [{"type": "text"}] * 2, "messages": [USER] * (MAX_REQUEST_ITEMS - 1)},
         "messages"),
        ({"input": [{"type": "reasoning", "summary": [{}] * MAX_REQUEST_ITEMS}]}, "input"),
    ],
)  # fmt: skip
def test_items_are_counted_together_nested_ones_too(body: dict[str, Any], param: str) -> None:
    refused = _refused(body)
    assert refused.code == "too_many_items" and refused.param == param


def test_a_request_at_every_bound_passes() -> None:
    entries = [str(i) for i in range(MAX_FIELD_ENTRIES)]
    check_request(
        {
            "messages": [USER] * (MAX_REQUEST_ITEMS - 2)
            + [{"role": "user", "content": [{"type": "text"}]}],
            "tools": [{"type": "function"}] * MAX_TOOLS,
            "stop": entries,
            "logit_bias": dict.fromkeys(entries, 1),
        }
    )


def test_tools_count_a_namespace_groups_own_tools() -> None:
    group = {"type": "namespace", "tools": [{"type": "function"}] * MAX_TOOLS}
    refused = _refused({"tools": [group]})
    assert refused.code == "too_many_tools" and refused.param == "tools"
    assert _refused({"tools": [{}] * (MAX_TOOLS + 1)}).code == "too_many_tools"


@pytest.mark.parametrize("field", ["stop", "stop_sequences", "logit_bias", "metadata", "prompt",
                                   "anything", "tools"])  # fmt: skip
def test_any_other_field_holds_a_bounded_number_of_entries(field: str) -> None:
    many = range(MAX_FIELD_ENTRIES + 1)
    value: Any = {str(i): 1 for i in many} if field != "prompt" else list(many)
    refused = _refused({field: value})
    assert refused.code == "too_many_entries" and refused.param == field


def test_counting_stops_once_past_the_bound() -> None:
    """A count reads at most ``limit`` of the nested lists' entries, however many there are."""
    huge: list[dict[str, Any]] = [{"content": [{}] * 1_000_000}] * 1_000
    assert count_items(huge, 10) > 10
    assert count_items([{"content": [{"content": [{}, {}]}]}], 100) == 4


def test_a_response_chain_is_bounded_with_its_history() -> None:
    history = [USER] * (MAX_REQUEST_ITEMS // 2)
    check_items([*history, *history], "previous_response_id")
    with pytest.raises(ApiError) as refused:
        check_items([*history, *history, USER], "previous_response_id")
    assert refused.value.param == "previous_response_id"


def test_remembered_tools_leave_the_format_what_they_left() -> None:
    """A request is refused or not whether its tool set was remembered or not: the format's
    schema gets what the tools' build left of the one budget."""
    check = SchemaCheck()
    tools = (ToolSpec("read", parameters=near_budget(3000)),)
    fmt = {"type": "json_schema", "json_schema": {"name": "o", "schema": near_budget(2000)}}
    check.check(Call("m", tools=tools), b"digest", "chat")  # remembered now
    assert len(check) == 1
    for _ in range(2):  # cold, then from memory: the same answer
        with pytest.raises(ApiError) as refused:
            check.check(Call("m", tools=tools, sampling=Sampling(response_format=fmt)),
                        b"digest", "chat")  # fmt: skip
        assert refused.value.code == "schema_too_large" and refused.value.param == "tools"
    small = {"type": "json_schema", "json_schema": {"name": "o", "schema": near_budget(500)}}
    check.check(Call("m", tools=tools, sampling=Sampling(response_format=small)), b"digest", "chat")


def test_a_long_user_id_is_not_parsed() -> None:
    short = json.dumps({"session_id": "s-1"})
    assert claude_code_session({"user_id": short}) == "s-1"
    padded = json.dumps({"session_id": "s-1", "pad": "x" * MAX_USER_ID_CHARS})
    assert claude_code_session({"user_id": padded}) is None
