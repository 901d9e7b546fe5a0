"""A real ``vllm serve`` (vLLM's CPU build) of SmolLM2-135M-Instruct as an ``engine = "openai"``
upstream (issue 39, item 4): ``talaria runtime --config node.toml`` fronts the server with
``sleep = "vllm"``, ``talaria serve --runtime URL`` fronts the runtime, and the real ``openai``
and ``anthropic`` clients ask the proxy. What is asserted is what the path guarantees (the
server's own text, a stream, cached tokens on a continuation, one session per run, a well-formed
tool answer, an aborted request, the sleep endpoints used, each call's class as vLLM's
priority), not the 135M model's wisdom.

The server starts once for the module (43 s on an idle 2-core machine): the CPU build's ``vllm``
console script does not work, so it is ``python -m vllm.entrypoints.openai.api_server`` of the
venv that runs the stage, in eager mode as Talaria's own CPU engines run (``--enforce-eager``;
without it the CPU build compiles the model with torch.compile at start: 125–300 s here),
with ``VLLM_SERVER_DEV_MODE=1`` for ``/sleep``, ``/wake_up`` and ``/is_sleeping`` (on CPU a
sleep pauses the scheduler and drops the prefix cache; the weights stay). The converted
directory's own chat template renders tools in the hermes format, so the server parses tool
calls with ``--tool-call-parser hermes``. It schedules by priority (``--scheduling-policy
priority``) and the node passes each call's class on (``priority = "vllm"``), so every call
here goes to the server with its priority (a standard call's is 3): what is shown is that the
server takes them and answers; the order vLLM makes of them is vLLM's (docs/upstream.md).
docs/upstream.md records a run.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.harness.processes import ServeProcess, free_port, talaria_runtime, talaria_serve
from tests.real.servers import ADMIN, Fronts, LoggedServer, logged_server, real_text
from tests.support import until

pytestmark = pytest.mark.vllm

SERVED = "smollm2-up"
"""The server's ``--served-model-name`` and the node's model name (not a catalog model)."""
WINDOW = 2048
STARTUP_S = 420.0
"""Longest wait for the server's first answer (70-150 s on 2 cores)."""
SYSTEM = (
    "You are a helpful assistant. You answer questions about geography, history and "
    "science in short, clear sentences. "
) * 12  # > 128 tokens: the CPU build caches whole 128-token blocks
GREEDY = {"temperature": 0}
"""For the Messages calls (the pinned ``anthropic`` client has no ``temperature`` argument)."""
NODE_TOML = """
[node]
name = "vllm-serve-node"
quantum_s = 30

[[model]]
name = "{name}"
engine = "openai"
url = "{url}"
sleep = "vllm"
priority = "vllm"
"""


class Upstream(LoggedServer):
    """The ``vllm serve`` process (None: one given by ``TALARIA_VLLM_SERVE_URL``), its root URL
    and its output so far (a file)."""

    def metric(self, name: str, labels: str = "") -> float:
        """The sum of the samples of ``name`` (whose labels contain ``labels``) in /metrics."""
        text = httpx.get(self.root + "/metrics", timeout=30).text
        total = 0.0
        for line in text.splitlines():
            head, _, value = line.rpartition(" ")
            if head.split("{")[0] == name and labels in head:
                total += float(value)
        return total


@dataclass
class Stack(Fronts):
    upstream: Upstream
    runtime: ServeProcess
    served: ServeProcess


def _serving(upstream: Upstream) -> bool:
    """Whether ``GET /v1/models`` lists the model."""
    try:
        listed = httpx.get(upstream.root + "/v1/models", timeout=5).json()["data"]
    except (httpx.HTTPError, ValueError, KeyError):
        return False
    return [m["id"] for m in listed] == [SERVED]


@pytest.fixture(scope="module")
def upstream(real_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    """``vllm serve`` of the real model (module docstring), stopped at the end."""
    given = os.environ.get("TALARIA_VLLM_SERVE_URL")
    if given:
        yield Upstream(None, given.rstrip("/"), Path(os.devnull))
        return
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-serve") / "vllm.log"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TALARIA_")},
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(real_dir), "--served-model-name", SERVED,
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(WINDOW),
        "--enable-prompt-tokens-details", "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes", "--enforce-eager", "--scheduling-policy", "priority",
    ]  # fmt: skip
    root = f"http://127.0.0.1:{port}"
    with logged_server(
        Upstream, "vllm serve", command, root, log, _serving, STARTUP_S, every_s=2.0, env=env
    ) as server:
        yield server


@pytest.fixture(scope="module")
def stack(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A node of one ``engine = "openai"`` model (its window read from the server) and a proxy
    with an admin token in front of it."""
    tmp = tmp_path_factory.mktemp("upstream-stack")
    config = tmp / "node.toml"
    config.write_text(NODE_TOML.format(name=SERVED, url=upstream.root + "/v1"))
    with talaria_runtime(config) as runtime:
        env = {"TALARIA_ADMIN_TOKEN": ADMIN}
        with talaria_serve(["--runtime", runtime.base_url], env, tmp / "data") as served:
            yield Stack(upstream, runtime, served)


def _ask(text: str) -> list[Any]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


def test_the_proxy_lists_the_model_with_the_servers_window(stack: Stack) -> None:
    listed = httpx.get(stack.served.v1 + "/models", timeout=30).json()["data"]
    assert [(m["id"], m["context_window"]) for m in listed] == [(SERVED, WINDOW)]


def test_a_chat_call_gets_the_real_models_answer(stack: Stack) -> None:
    reply = stack.client().chat.completions.create(
        model=SERVED,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=24,
    )
    text = real_text(reply.choices[0].message.content)
    assert "Paris" in text, text
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 24


def test_a_calls_class_reaches_the_server_as_its_priority(stack: Stack) -> None:
    """A batch call carries vLLM priority 5 (runtime/engines/priorities.py): the server,
    scheduling by priority, takes it and answers with the real model; the proxy records the
    class it was served in."""
    client = stack.client(session="up-batch")
    reply = client.chat.completions.create(
        model=SERVED,
        messages=[{"role": "user", "content": "What is the capital of Spain?"}],
        temperature=0,
        max_tokens=16,
        extra_headers={"X-Talaria-Priority": "batch"},
    )
    real_text(reply.choices[0].message.content)
    calls = stack.admin("/admin/sessions/up-batch")["calls"]
    assert [(c["status"], c["priority_served"]) for c in calls] == [("ok", "batch")]


def test_a_stream_comes_in_pieces(stack: Stack) -> None:
    stream = stack.client().chat.completions.create(
        model=SERVED,
        messages=[{"role": "user", "content": "Name three colours."}],
        temperature=0,
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    pieces = [p for p in pieces if p]
    assert len(pieces) > 1, pieces
    real_text("".join(pieces))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_a_continuation_reads_cached_tokens(stack: Stack) -> None:
    client = stack.client(session="up-continue")
    messages = _ask("What is the capital of France?")
    first = client.chat.completions.create(
        model=SERVED, messages=messages, temperature=0, max_tokens=20
    )
    answer = real_text(first.choices[0].message.content)
    messages += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And of Italy?"},
    ]
    second = client.chat.completions.create(
        model=SERVED, messages=messages, temperature=0, max_tokens=20
    )
    real_text(second.choices[0].message.content)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens or 0
    print(f"continuation: {cached} of {second.usage.prompt_tokens} prompt tokens cached")
    assert cached > 0
    calls = stack.admin("/admin/sessions/up-continue")["calls"]
    assert [c["status"] for c in calls] == ["ok", "ok"]


def test_messages_and_responses_answer_with_the_real_model(stack: Stack) -> None:
    claude = stack.claude()
    message = claude.messages.create(
        model=SERVED,
        max_tokens=24,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        extra_body=GREEDY,
    )
    text = "".join(b.text for b in message.content if b.type == "text")
    assert "Paris" in real_text(text), text
    assert message.stop_reason in ("end_turn", "max_tokens")
    response = stack.client().responses.create(
        model=SERVED, input="What is the capital of France?", max_output_tokens=24, temperature=0
    )
    assert "Paris" in real_text(response.output_text), response.output_text
    assert response.status in ("completed", "incomplete")


def test_an_agent_run_is_one_session(stack: Stack) -> None:
    """Three turns of one conversation without any session header: the proxy finds them to be
    one session, as it does for its own engines."""
    before = {s["session_key"] for s in stack.admin("/admin/sessions?limit=200")["data"]}
    claude = stack.claude()
    messages: list[Any] = [{"role": "user", "content": "Tell me one fact about the sea."}]
    for follow_up in ("Another one, please.", "And one about rivers."):
        reply = claude.messages.create(
            model=SERVED, max_tokens=24, system=SYSTEM, messages=messages, extra_body=GREEDY
        )
        text = "".join(b.text for b in reply.content if b.type == "text")
        messages += [
            {"role": "assistant", "content": real_text(text)},
            {"role": "user", "content": follow_up},
        ]
    last = claude.messages.create(
        model=SERVED, max_tokens=24, system=SYSTEM, messages=messages, extra_body=GREEDY
    )
    assert last.usage.cache_read_input_tokens and last.usage.cache_read_input_tokens > 0
    sessions = stack.admin("/admin/sessions?limit=200")["data"]
    new = [s for s in sessions if s["session_key"] not in before]
    assert [s["calls"] for s in new] == [3], new


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_tools_through_the_servers_own_parser(stack: Stack) -> None:
    """The server's hermes parser, streamed through the node: offered a tool (``auto``), a
    valid answer, a tool call or, SmolLM2 being tiny, text; with ``required`` the model writes a
    ``<tool_call>`` that the server parses into a call (its arguments SmolLM2's, any JSON
    object: only a named choice is decoded under the schema)."""
    ask: list[Any] = [
        {"role": "system", "content": "You call tools. To answer, call get_weather."},
        {"role": "user", "content": "Call get_weather for Paris."},
    ]
    tools: list[Any] = [WEATHER]
    choices: tuple[Any, ...] = ("auto", "required")
    for choice_asked in choices:
        reply = stack.client().chat.completions.create(
            model=SERVED,
            messages=ask,
            tools=tools,
            tool_choice=choice_asked,
            temperature=0,
            max_tokens=150,
        )
        choice = reply.choices[0]
        calls = [c for c in choice.message.tool_calls or [] if c.type == "function"]
        print(f"tool_choice {choice_asked}: {choice.finish_reason}, {choice.message.content!r}, "
              f"{[(c.function.name, c.function.arguments) for c in calls]}")  # fmt: skip
        if calls or choice_asked == "required":
            assert choice.finish_reason == "tool_calls"
            assert [c.function.name for c in calls] == ["get_weather"] * max(1, len(calls))
            assert all(isinstance(json.loads(c.function.arguments), dict) for c in calls)
            assert all(c.id for c in calls)
            assert "<tool_call>" not in (choice.message.content or "")
        else:
            real_text(choice.message.content)
            assert choice.finish_reason in ("stop", "length")


def _running(stack: Stack) -> float:
    return stack.upstream.metric("vllm:num_requests_running")


GONE = {"X-Talaria-Session-Id": "up-gone"}


def test_a_client_gone_mid_stream_aborts_the_upstream_request(stack: Stack) -> None:
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "Write a very long story."}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    pieces, running = 0, -1.0
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", stack.served.v1 + "/chat/completions", json=body, headers=GONE) as r,
    ):
        for line in r.iter_lines():
            pieces += '"content"' in line
            if pieces == 5:  # generating while the client reads (leaving the loop closes it)
                running = _running(stack)
                break
    assert running == 1
    assert until(lambda: _running(stack) == 0)
    assert until(lambda: stack.statuses("up-gone") == ["cancelled"]), stack.statuses("up-gone")
    generated = stack.upstream.metric("vllm:generation_tokens_total")
    threading.Event().wait(2.0)  # a real server's state: no event to wait on
    assert stack.upstream.metric("vllm:generation_tokens_total") == generated  # nothing runs on


def test_the_node_used_the_servers_sleep_endpoints(stack: Stack) -> None:
    """The node put the server to sleep at start and woke it for its slot."""
    sleeping = httpx.get(stack.upstream.root + "/is_sleeping", timeout=30).json()
    assert sleeping == {"is_sleeping": False}  # awake: the model holds the slot
    count = "vllm:sleep_mode_operation_duration_seconds_count"
    assert stack.upstream.metric(count, 'operation="sleep"') >= 1
    assert stack.upstream.metric(count, 'operation="wake"') >= 1
