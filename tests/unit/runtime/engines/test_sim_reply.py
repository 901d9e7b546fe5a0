"""The simulated engine's replies: harmless tool calls with schema-valid arguments while the
conversation is young, a final answer after N tool calls, and a stream that hands out exactly
the reply. The tool schemas are the ones the real agents send (bench/fixtures/agent_tools/,
captured from Claude Code 2.1.328, Codex 0.169.0 and Qwen Code 0.24.4, descriptions removed)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from talaria.core.calls import (
    AUTO,
    Call,
    ModelOutput,
    OutputAccumulator,
    Sampling,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from talaria.core.schema_instance import instance
from talaria.core.types import CallRequest
from talaria.runtime.engines.sim_reply import ReplyPolicy, ReplyStream, pick_tool, plan_reply
from tests.support import REPO_ROOT

FIXTURES = REPO_ROOT / "bench" / "fixtures" / "agent_tools"
AGENTS = {p.stem: json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))}


def _tools(agent: str) -> tuple[ToolSpec, ...]:
    return tuple(ToolSpec(t["name"], "", t["parameters"]) for t in AGENTS[agent])


@pytest.mark.parametrize(
    ("agent", "tool"),
    [("claude-code", "Read"), ("codex", "exec_command"), ("qwen-code", "glob")],
)
def test_the_harmless_tool_each_agent_gets(agent: str, tool: str) -> None:
    picked = pick_tool(_tools(agent))
    assert picked is not None and picked.name == tool


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_arguments_are_valid_for_every_tool_the_agents_send(agent: str) -> None:
    for spec in _tools(agent):
        arguments = instance(dict(spec.parameters))
        jsonschema.validate(arguments, dict(spec.parameters))


@pytest.mark.parametrize(
    ("name", "properties", "picked"),
    [
        ("write_file", {"path": {"type": "string"}}, False),
        ("delete_branch", {}, False),
        ("spawn_agent", {}, False),
        ("apply_patch", {"input": {"type": "string"}}, False),
        ("bash", {}, False),  # a shell we could not hand a harmless command
        ("bash", {"command": {"type": "string"}}, True),
        ("list_directory", {"path": {"type": "string"}}, True),
        ("ReadFile", {"file_path": {"type": "string"}}, True),
    ],
)
def test_what_counts_as_harmless(name: str, properties: dict[str, Any], picked: bool) -> None:
    spec = ToolSpec(name, "", {"type": "object", "properties": properties})
    assert (pick_tool((spec,)) is not None) is picked


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
         {"cmd": "ls"}),
        ({"type": "object", "required": ["command"],
          "properties": {"command": {"type": "array", "items": {"type": "string"}}}},
         {"command": ["ls"]}),
        ({"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]},
         {"pattern": "*"}),
        ({"type": "object", "required": ["n"],
          "properties": {"n": {"type": "integer", "minimum": 5}}}, {"n": 5}),
        ({"type": "object", "properties": {"m": {"enum": ["a", "b"]}}, "required": ["m"]},
         {"m": "a"}),
        ({"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}}, "required": ["x"],
          "$defs": {"X": {"type": "boolean"}}}, {"x": False}),
        ({"type": "object", "properties": {"o": {"anyOf": [{"type": "null"}, {"type": "string"}]}},
          "required": ["o"]}, {"o": "simulated"}),
        ({"type": "object", "properties": {"file_path": {"type": "string",
          "description": "The absolute path"}}, "required": ["file_path"]},
         {"file_path": "/etc/hostname"}),
    ],
)  # fmt: skip
def test_schema_instances(schema: dict[str, Any], expected: Any) -> None:
    assert instance(schema) == expected
    jsonschema.validate(expected, schema)


def _request(
    history_calls: int,
    tools: tuple[ToolSpec, ...] = (),
    choice: ToolChoice = AUTO,
    **extra: Any,
) -> CallRequest:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    for k in range(history_calls):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "x", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": "ok"},
        ]
    return CallRequest(
        request_id=f"req-{history_calls}",
        session_key="s",
        model="m",
        prompt_tokens=50,
        max_output_tokens=extra.pop("max_output_tokens", 512),
        call=Call("m", messages=tuple(messages), tools=tools, tool_choice=choice, **extra),
    )


def test_tool_calls_until_the_policy_says_answer() -> None:
    tools = _tools("qwen-code")
    policy = ReplyPolicy(tool_calls_before_answer=3)
    finishes = [plan_reply(_request(k, tools), policy)[0].finish_reason for k in range(5)]
    assert finishes[:3] == ["tool_calls"] * 3
    assert all(f in ("stop", "length") for f in finishes[3:])  # the answer (length: capped)
    answer, tokens = plan_reply(_request(3, tools), policy)
    assert answer.text.startswith("[simulated]") and not answer.tool_calls and tokens >= 1


def test_tool_choice_none_required_and_named() -> None:
    tools = _tools("claude-code")
    policy = ReplyPolicy(tool_calls_before_answer=0)
    none, _ = plan_reply(_request(0, tools, ToolChoice("none")), policy)
    assert not none.tool_calls
    required, _ = plan_reply(_request(9, tools, ToolChoice("required")), policy)
    assert [c.name for c in required.tool_calls] == ["Read"]
    named, _ = plan_reply(_request(9, tools, ToolChoice("named", "Write")), policy)
    assert [c.name for c in named.tool_calls] == ["Write"]  # named: even a tool that writes
    jsonschema.validate(json.loads(named.tool_calls[0].arguments), dict(tools[-1].parameters))


def test_reasoning_json_stop_and_length() -> None:
    policy = ReplyPolicy()
    thought, _ = plan_reply(_request(0, reasoning_effort="medium"), policy)
    assert thought.reasoning.startswith("[simulated reasoning]")
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    structured, _ = plan_reply(_request(0, sampling=Sampling(response_format=fmt)), policy)
    jsonschema.validate(json.loads(structured.text), schema)
    stopped, _ = plan_reply(_request(0, sampling=Sampling(stop=(" engine",))), policy)
    assert "engine" not in stopped.text and stopped.finish_reason == "stop"
    capped, tokens = plan_reply(_request(0, max_output_tokens=3), policy)
    assert tokens <= 3 and capped.finish_reason == "length"


def test_replies_are_seeded_by_the_request_id() -> None:
    assert plan_reply(_request(1), ReplyPolicy()) == plan_reply(_request(1), ReplyPolicy())


_outputs = st.builds(
    ModelOutput,
    st.text(max_size=60),
    st.text(max_size=30),
    st.lists(
        st.builds(ToolCall, st.text(min_size=1, max_size=5), st.text(min_size=1, max_size=8),
                  st.text(max_size=40)),
        max_size=3,
    ).map(tuple),
)  # fmt: skip


@given(_outputs, st.integers(1, 50), st.lists(st.integers(1, 7), min_size=1, max_size=60))
def test_a_stream_hands_out_exactly_the_reply(
    output: ModelOutput, tokens: int, steps: list[int]
) -> None:
    stream = ReplyStream(output, tokens)
    folded = OutputAccumulator()
    for step in steps:
        folded.add(stream.take(step))
    folded.add(stream.take(tokens))  # the rest
    result = folded.output(output.finish_reason)
    assert result == output
