"""The schema builder's budget (core/schema_instance.py): every schema a client can send is
either built within MAX_INSTANCE_VALUES values and MAX_INSTANCE_CHARS characters or refused
with SchemaTooLarge, one request's schemas share one budget, and the schemas real agents send
are built as before."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from talaria.core.calls import ToolSpec
from talaria.core.schema_instance import (
    MAX_INSTANCE_CHARS,
    MAX_INSTANCE_VALUES,
    InstanceBudget,
    SchemaTooLarge,
    check_schemas,
    instance,
)
from tests.schemas import SCHEMAS
from tests.support import REPO_ROOT, near_budget

FIXTURES = REPO_ROOT / "bench" / "fixtures" / "agent_tools"

SELF_TWICE = {
    "$defs": {
        "node": {
            "type": "object",
            "required": ["a", "b"],
            "properties": {"a": {"$ref": "#/$defs/node"}, "b": {"$ref": "#/$defs/node"}},
        }
    },
    "$ref": "#/$defs/node",
}
"""Requires itself twice: 2^depth values without a budget (2^8 = 256 at MAX_DEPTH: fine)."""

SELF_MANY = {
    "$defs": {
        "n": {
            "type": "object",
            "required": [f"k{i}" for i in range(40)],
            "properties": {f"k{i}": {"$ref": "#/$defs/n"} for i in range(40)},
        }
    },
    "$ref": "#/$defs/n",
}
"""40^8 values without a budget."""

BOMBS: dict[str, Any] = {
    "minItems 1e9": {"type": "array", "minItems": 10**9, "items": {"type": "string"}},
    "minLength 1e12": {"type": "string", "minLength": 10**12},
    "nested minItems": {
        "type": "array",
        "minItems": 5000,
        "items": {"type": "array", "minItems": 5000, "items": {"type": "integer"}},
    },
    "arrays past the depth limit": {
        "type": "array",
        "minItems": 9000,
        "items": {
            "type": "array",
            "minItems": 9000,
            "items": {"type": "array", "minItems": 9000, "items": {}},
        },
    },
    "recursive $ref": SELF_MANY,
    "a big default repeated": {
        "type": "array",
        "minItems": 5000,
        "items": {"type": "string", "default": "x" * 50_000},
    },
    "a huge integer minimum repeated": {
        "type": "array",
        "minItems": 5000,
        "items": {"type": "integer", "minimum": 10**4000},
    },
    "a long key repeated": {
        "type": "array",
        "minItems": 5000,
        "items": {"type": "object", "required": ["k" * 5000], "properties": {}},
    },
}


@pytest.mark.parametrize("schema", BOMBS.values(), ids=BOMBS.keys())
def test_a_schema_bomb_is_refused(schema: dict[str, Any]) -> None:
    with pytest.raises(SchemaTooLarge) as refused:
        instance(schema)
    assert refused.value.code == "schema_too_large"


def test_a_self_requiring_schema_within_the_depth_limit_is_built() -> None:
    built = instance(SELF_TWICE)
    assert isinstance(built, dict) and set(built) == {"a", "b"}


def test_a_large_but_bounded_instance_is_built() -> None:
    built = instance({"type": "array", "minItems": 500, "items": {"type": "integer"}})
    assert built == [1] * 500


@pytest.mark.parametrize("agent", ["claude-code", "codex", "qwen-code"])
def test_the_schemas_agents_send_pass(agent: str) -> None:
    tools = json.loads((FIXTURES / f"{agent}.json").read_text())
    specs = [
        ToolSpec(t["name"], parameters=t.get("input_schema") or t.get("parameters") or {})
        for t in tools
    ]
    check_schemas(specs, None, "response_format")
    for spec in specs:  # far inside the budget (the module docstring's "at most 4 values")
        budget = InstanceBudget()
        instance(spec.parameters, budget=budget)
        assert MAX_INSTANCE_VALUES - budget.values <= 4


def test_check_schemas_names_the_tool_or_the_format() -> None:
    good = ToolSpec("read", parameters={"type": "object"})
    bomb = ToolSpec("list", parameters=BOMBS["minItems 1e9"])
    with pytest.raises(SchemaTooLarge) as refused:
        check_schemas([good, bomb], None, "response_format")
    assert refused.value.param == "tools[1]" and "'list'" in str(refused.value)
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": BOMBS["recursive $ref"]}}
    with pytest.raises(SchemaTooLarge) as refused:
        check_schemas([good], fmt, "text.format")
    assert refused.value.param == "text.format"
    check_schemas([good], {"type": "json_object"}, "response_format")


@pytest.mark.parametrize("agent", ["claude-code", "codex", "qwen-code"])
def test_an_agents_whole_tool_set_takes_a_sliver_of_one_request_budget(agent: str) -> None:
    """What the module docstring says the agents' tool sets build: 20–26 values and 110–195
    characters each, over 150 times under one request's budget."""
    tools = json.loads((FIXTURES / f"{agent}.json").read_text())
    specs = [
        ToolSpec(t["name"], parameters=t.get("input_schema") or t.get("parameters") or {})
        for t in tools
    ]
    left = check_schemas(specs, None, "response_format")
    assert MAX_INSTANCE_VALUES - left.values <= 26 < MAX_INSTANCE_VALUES // 150
    assert MAX_INSTANCE_CHARS - left.chars <= 195


def test_the_schemas_of_a_request_share_one_budget() -> None:
    """The finding: 1,000 tools each just under the budget passed one by one (4 million values,
    seconds of the loop); together they are refused, naming the request, after at most one
    budget's worth of building (and one more to tell whether the last schema fits alone)."""
    tools = [ToolSpec(f"t{i}", parameters=near_budget(4000)) for i in range(1000)]
    budget = InstanceBudget()
    with pytest.raises(SchemaTooLarge) as refused:
        check_schemas(tools, None, "response_format", budget)
    assert refused.value.param == "tools" and "together" in str(refused.value)
    assert budget.values >= 0  # never spent past it
    check_schemas(tools[:1], None, "response_format")  # each alone fits


def test_a_response_format_shares_the_tools_budget() -> None:
    tools = [ToolSpec("read", parameters=near_budget(3000))]
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": near_budget(2000)}}
    check_schemas(tools, None, "response_format")
    check_schemas((), fmt, "response_format")
    with pytest.raises(SchemaTooLarge) as refused:
        check_schemas(tools, fmt, "text.format")
    assert refused.value.param == "tools"
    left = check_schemas(tools, None, "response_format")  # as the proxy's remembered tools
    with pytest.raises(SchemaTooLarge) as again:
        check_schemas((), fmt, "text.format", left)
    assert again.value.param == "tools"


def test_a_schema_past_the_budget_alone_is_named_after_others_spent_some() -> None:
    tools = [
        ToolSpec("read", parameters=near_budget(100)),
        ToolSpec("list", parameters=BOMBS["nested minItems"]),
    ]
    with pytest.raises(SchemaTooLarge) as refused:
        check_schemas(tools, None, "response_format")
    assert refused.value.param == "tools[1]" and "'list'" in str(refused.value)


# -- any schema (tests/schemas.py): built within the budget, or refused ---------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=SCHEMAS, defs=SCHEMAS)
def test_any_schema_is_built_within_the_budget_or_refused(schema: Any, defs: Any) -> None:
    if isinstance(schema, dict):
        schema = {**schema, "$defs": {"x": defs}}
    try:
        built = instance(schema)
    except SchemaTooLarge:
        return
    text = json.dumps(built)
    # every character of a string may escape to 6 (\u0000); each other value: ≤ 32 characters
    assert len(text) <= 6 * MAX_INSTANCE_CHARS + 32 * MAX_INSTANCE_VALUES
