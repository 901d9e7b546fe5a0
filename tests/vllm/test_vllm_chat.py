"""Real model serving through vLLM's own components: the real ``openai`` and ``anthropic``
clients → proxy → ``talaria runtime`` (a real process) → vLLM (CPU build) serving a tiny
random-weight model with a real Hugging Face tokenizer and a chat template that renders tools
(tiny_chat.py). vLLM renders the prompt (tools included), converts the sampling parameters,
enforces structured outputs, and parses tool calls and reasoning (``hermes`` and ``qwen3``,
as for Qwen3): the proxy and the runtime only carry the call and the deltas.

Random weights say nothing sensible, so what is checked is what structure guarantees: a
forced tool call's arguments follow the tool's schema (the node holds every tool to its schema:
``tool_strict_level = "parameter"``), JSON output follows ``response_format``, a fixed seed
repeats itself, ``stop`` cuts, logprobs come back, and vLLM's own validation errors reach the
caller as 400s.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from talaria.core.catalog import load_catalog
from talaria.proxy.contract.settings import ProxySettings
from tests.integration.server import RunningProxy, running_proxy
from tests.vllm.runtime_process import running_runtime
from tests.vllm.tiny_chat import build_tiny_chat

pytestmark = pytest.mark.vllm

MODEL = "tiny-chat"
NODE = """
[node]
name = "chat-node"

[[model]]
name = "tiny-chat"
engine = "vllm"
path = "{path}"
max_model_len = 2048
tool_parser = "hermes"
reasoning_parser = "qwen3"
tool_strict_level = "parameter"
structured_outputs_config = {{ backend = "xgrammar", disable_any_whitespace = true }}
"""
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "enum": ["src", "tests"]},
        "recursive": {"type": "boolean"},
    },
    "required": ["path", "recursive"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "list_files", "description": "List files.", "parameters": SCHEMA},
    }
]
FORCED: Any = {"type": "function", "function": {"name": "list_files"}}
NO_THINKING: dict[str, Any] = {"reasoning_effort": "none"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_chat(tmp_path_factory.mktemp("tiny-chat"))


@pytest.fixture(scope="module")
def proxy(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("chat-node")
    config = tmp / "node.toml"
    config.write_text(NODE.format(path=model_dir))
    with running_runtime(config) as url:
        settings = ProxySettings(
            database_url=f"sqlite+aiosqlite:///{tmp}/p.db",
            admin_token="admin-secret-token",
            runtimes=[url],
        )
        with running_proxy(settings) as running:
            yield running


@pytest.fixture
def client(proxy: RunningProxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)


def _ask(client: openai.OpenAI, **extra: Any) -> Any:
    messages = extra.pop("messages", [{"role": "user", "content": "list the files please"}])
    return client.chat.completions.create(model=MODEL, messages=messages, **extra)


def test_a_named_tool_choice_gives_schema_valid_arguments(client: openai.OpenAI) -> None:
    reply = _ask(client, tools=TOOLS, tool_choice=FORCED, max_tokens=80, extra_body=NO_THINKING)
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "list_files"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    stream = _ask(
        client, tools=TOOLS, tool_choice=FORCED, max_tokens=80, stream=True, extra_body=NO_THINKING
    )
    parts = [tc for c in stream if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert parts[0].function.name == "list_files" and parts[0].id
    arguments = "".join(p.function.arguments or "" for p in parts)
    jsonschema.validate(json.loads(arguments), SCHEMA)


def test_response_format_gives_schema_valid_json(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    reply = _ask(
        client,
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "v", "schema": schema}},
        extra_body=NO_THINKING,
    )
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


def test_seed_stop_and_logprobs(client: openai.OpenAI) -> None:
    greedy = {"temperature": 0, "seed": 3, "max_tokens": 8, "extra_body": NO_THINKING}
    assert _ask(client, **greedy).choices[0].message.content == (
        _ask(client, **greedy).choices[0].message.content
    )
    fixed = {"temperature": 0.9, "seed": 11, "max_tokens": 12, "extra_body": NO_THINKING}
    first = _ask(client, **fixed).choices[0].message.content
    again = _ask(client, **fixed).choices[0].message.content
    assert first and first == again
    cut = first[len(first) // 2]
    stopped = _ask(client, stop=[cut], **fixed)
    assert stopped.choices[0].message.content == first[: first.index(cut)]
    assert stopped.choices[0].finish_reason == "stop"
    scored = _ask(client, logprobs=True, top_logprobs=2, max_tokens=4, extra_body=NO_THINKING)
    content = scored.choices[0].logprobs.content
    assert content and all(len(p.top_logprobs) == 2 for p in content)


def test_reasoning_goes_through_the_reasoning_parser(client: openai.OpenAI) -> None:
    """With thinking on (the template's default) the qwen3 parser files the output as
    reasoning until ``</think>``; with it off, the template closes the think block and the
    output is content."""
    thinking = _ask(client, max_tokens=8, temperature=0, seed=1).choices[0].message
    assert (thinking.model_extra or {}).get("reasoning_content")
    plain = _ask(client, max_tokens=8, temperature=0, seed=1, extra_body=NO_THINKING)
    assert plain.choices[0].message.content
    assert not (plain.choices[0].message.model_extra or {}).get("reasoning_content")


def test_the_rendered_prefix_is_reused_with_tools(client: openai.OpenAI, model_dir: Path) -> None:
    """vLLM counts the prompt after rendering, tools included; the session's second call,
    which appends to the first call's messages and reply, is served from the cached prefix."""
    from transformers import AutoTokenizer

    messages: list[Any] = [{"role": "user", "content": "list the files in src " * 8}]
    headers = {"X-Talaria-Session-Id": "prefix-with-tools"}
    kwargs = {"tools": TOOLS, "max_tokens": 60, "extra_body": NO_THINKING, "extra_headers": headers}
    first = _ask(client, messages=messages, tool_choice=FORCED, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    text = tokenizer.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    assert first.usage.prompt_tokens == len(tokenizer.encode(text, add_special_tokens=False))
    call = first.choices[0].message.tool_calls[0]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.py b.py"},
    ]
    second = _ask(client, messages=messages, tool_choice="auto", **kwargs)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens > 0


def test_vllms_validation_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _ask(client, max_tokens=4, top_logprobs=2)  # top_logprobs without logprobs
    assert "logprobs" in info.value.message


def test_messages_and_responses_reach_the_model_through_the_same_path(
    proxy: RunningProxy,
) -> None:
    claude = anthropic.Anthropic(base_url=proxy.base_url, api_key="x", max_retries=0)
    message = claude.messages.create(
        model=MODEL,
        max_tokens=80,
        thinking={"type": "disabled"},
        tools=[{"name": "list_files", "input_schema": SCHEMA}],
        tool_choice={"type": "tool", "name": "list_files"},
        messages=[{"role": "user", "content": "list the files"}],
    )
    [use] = [b for b in message.content if b.type == "tool_use"]
    jsonschema.validate(use.input, SCHEMA)
    assert message.stop_reason == "tool_use"
    client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
    response = client.responses.create(
        model=MODEL,
        input="list the files",
        tools=[{"type": "function", "name": "list_files", "parameters": SCHEMA, "strict": True}],
        tool_choice={"type": "function", "name": "list_files"},
        reasoning={"effort": "none"},
        max_output_tokens=80,
    )
    [fc] = [i for i in response.output if i.type == "function_call"]
    jsonschema.validate(json.loads(fc.arguments), SCHEMA)


def test_every_shipped_model_names_parsers_the_pinned_vllm_has() -> None:
    from vllm.reasoning.abs_reasoning_parsers import ReasoningParserManager
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    tools = set(ToolParserManager.list_registered())
    reasoning = set(ReasoningParserManager.list_registered())
    for spec in load_catalog().models.values():
        assert not spec.tool_parser or spec.tool_parser in tools, spec.name
        assert not spec.reasoning_parser or spec.reasoning_parser in reasoning, spec.name


@pytest.mark.parametrize(
    ("content", "max_tokens"),
    [("word " * 3000, 8), ("list the files", 4000)],
    ids=["prompt-over-the-window", "max-tokens-over-the-window"],
)
def test_a_call_over_the_context_window_is_a_400_in_each_dialect(
    proxy: RunningProxy, client: openai.OpenAI, content: str, max_tokens: int
) -> None:
    """vLLM's chat layer refuses a prompt, or a prompt plus ``max_tokens``, beyond the model's
    max_model_len (2048): the caller gets a 400 (context_length_exceeded), never a 503 or
    Anthropic's 529 (which Claude Code would retry as an overload)."""
    messages = [{"role": "user", "content": content}]
    with pytest.raises(openai.BadRequestError) as info:
        _ask(client, messages=messages, max_tokens=max_tokens, extra_body=NO_THINKING)
    assert info.value.code == "context_length_exceeded", info.value.message
    reply = httpx.post(
        proxy.base_url + "/v1/messages",
        json={"model": MODEL, "max_tokens": max_tokens, "messages": messages},
        timeout=120,
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["type"] == "invalid_request_error"
