"""The APIs ``bench/proxy_overhead.py`` drives: for each, its path, the body of call ``c`` of
session ``s`` (a SWE-agent-like history that grows by one tool round per call), a cheap judge
of a reply during measurement and a full check of one (on the warm-up).

- ``chat``: OpenAI chat completions; the reply's text arrives as ``delta.content`` chunks;
- ``messages``: Anthropic Messages; as ``text_delta`` events;
- ``responses``: OpenAI Responses; as ``response.output_text.delta`` events.

A streamed reply of ``tokens`` tokens must carry exactly ``tokens`` text events (the servers
hand out one word per token).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from overhead.client import HttpError

MODEL = "bench-model"
SYSTEM = (
    "You are a software engineering agent working in a Python repository. Use the tools to "
    "inspect files, run the tests and edit code until the failing test passes. Think step by "
    "step, keep each change small, and explain what you changed and why. "
) * 3
TOOL_OUTPUT = (
    "$ pytest tests/test_module_{j}.py -x -q\n"
    "F....\n"
    "FAILED tests/test_module_{j}.py::test_case_{step} - AssertionError: expected 4, got 5\n"
    "  File src/module_{j}.py, line {line}, in compute\n"
    "    return total + offset\n"
    "1 failed, 4 passed in 0.{step}3s\n"
)


def _task(session: int) -> str:
    return (
        f"Task {session}: tests/test_module_{session}.py fails after the last refactor of "
        f"src/module_{session}.py. Find the cause and fix it."
    )


def _steps(session: int, call: int) -> list[tuple[str, str]]:
    """(assistant text, tool output) of the earlier steps."""
    return [
        (
            f"Step {step}: running the tests of module {session} again.",
            TOOL_OUTPUT.format(j=session, step=step, line=40 + step),
        )
        for step in range(call)
    ]


def _dump(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def chat_body(session: int, call: int, stream: bool) -> bytes:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": _task(session)},
    ]
    for said, output in _steps(session, call):
        messages += [{"role": "assistant", "content": said}, {"role": "user", "content": output}]
    body: dict[str, Any] = {"model": MODEL, "messages": messages}
    if stream:
        body["stream"] = True
    return _dump(body)


def messages_body(session: int, call: int, stream: bool) -> bytes:
    messages: list[dict[str, Any]] = [{"role": "user", "content": _task(session)}]
    for said, output in _steps(session, call):
        messages += [{"role": "assistant", "content": said}, {"role": "user", "content": output}]
    body = {"model": MODEL, "system": SYSTEM, "max_tokens": 256, "messages": messages}
    if stream:
        body["stream"] = True
    return _dump(body)


def responses_body(session: int, call: int, stream: bool) -> bytes:
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": _task(session)}]
    for said, output in _steps(session, call):
        items += [
            {"type": "message", "role": "assistant", "content": said},
            {"type": "message", "role": "user", "content": output},
        ]
    body = {"model": MODEL, "instructions": SYSTEM, "input": items, "store": False}
    if stream:
        body["stream"] = True
    return _dump(body)


AGENT_TOOLS = Path(__file__).resolve().parents[1] / "fixtures" / "agent_tools"
SOURCE_LINE = "    value_{i} = compute_{j}(items[{i}], offset={k})  # step {i} of module {j}\n"


def _file_text(session: int, step: int, lines: int = 60) -> str:
    """A read_file result: ``lines`` lines of Python source (about 4 KB), different for each
    session and step."""
    head = f"# src/module_{session}/part_{step}.py\ndef handler_{step}(items, offset):\n"
    body = "".join(SOURCE_LINE.format(i=i, j=session, k=step) for i in range(lines))
    return head + body


def _tools() -> list[dict[str, Any]]:
    """Qwen Code's tools as it sends them on chat completions (captured:
    bench/fixtures/agent_tools/qwen-code.json)."""
    tools = json.loads((AGENT_TOOLS / "qwen-code.json").read_text())
    return [
        {"type": "function", "function": {"name": t["name"], "description": t.get("description",
         f"The {t['name']} tool."), "parameters": t["parameters"]}}
        for t in tools
    ]  # fmt: skip


def agent_chat_body(session: int, call: int, stream: bool, size: int) -> bytes:
    """An agent's chat completion of about ``size`` bytes: a coding agent's system prompt, its
    tools (Qwen Code's) and a history of read_file rounds (an assistant tool call, a ~4 KB tool
    result); call ``c`` of a session adds ``c`` rounds to its call 0, so a session's calls
    extend one another as an agent's do, and its four calls straddle ``size``. Up to 4 KB, the
    short SWE-agent history of ``chat_body`` (0.9–1.9 KB) instead."""
    if size <= 4096:
        return chat_body(session, call, stream)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM * 4},
        {"role": "user", "content": _task(session)},
    ]
    body: dict[str, Any] = {"model": MODEL, "messages": messages}
    body["tools"] = _tools()
    base = len(_dump(body))
    per_round = len(json.dumps(_round(session, 0))) + 1
    rounds = max(0, (size - base) // per_round - 2) + call  # calls 0-3 straddle ``size``
    for step in range(rounds):
        messages += _round(session, step)
    if stream:
        body["stream"] = True
    return _dump(body)


def _round(session: int, step: int) -> list[dict[str, Any]]:
    call_id = f"call_{session}_{step}"
    path = f"src/module_{session}/part_{step}.py"
    return [
        {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function",
         "function": {"name": "read_file", "arguments": json.dumps({"absolute_path": path})}}]},
        {"role": "tool", "tool_call_id": call_id, "content": _file_text(session, step)},
    ]  # fmt: skip


def _events(body: bytes) -> list[bytes]:
    return [e for e in body.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]


def _data(event: bytes) -> dict[str, Any]:
    for line in event.split(b"\n"):
        if line.startswith(b"data: "):
            parsed: dict[str, Any] = json.loads(line[6:])
            return parsed
    raise HttpError(f"no data line in {event!r}")


def _count(body: bytes, is_text: Callable[[dict[str, Any]], bool]) -> int:
    return sum(1 for event in _events(body) if is_text(_data(event)))


@dataclass(frozen=True)
class Api:
    name: str
    path: str
    body: Callable[[int, int, bool], bytes]
    last_event: bytes
    """How the last SSE data line of a complete stream starts."""
    json_marker: bytes
    """What every complete non-streamed reply holds."""
    error_marker: bytes
    """What only an error event of a stream holds."""
    text_events: Callable[[bytes], int]
    text_of: Callable[[dict[str, Any]], str]

    def judge(self, stream: bool) -> Callable[[int, bytes], str | None]:
        """A cheap judge of a reply: None if it looks right, else what is wrong."""

        def judge(status: int, body: bytes) -> str | None:
            if status != 200:
                return f"HTTP {status}: {body[:300]!r}"
            if stream:
                last = body[body.rfind(b"\ndata: ") + 1 :]
                if not last.startswith(self.last_event):
                    return f"stream not ended by {self.last_event!r}: {body[-200:]!r}"
                if self.error_marker in body:
                    return f"error event in stream: {body[:300]!r}"
            elif self.json_marker not in body:
                return f"no {self.json_marker!r}: {body[:300]!r}"
            return None

        return judge

    def validate(self, stream: bool, body: bytes, tokens: int) -> dict[str, Any]:
        """Parse a reply fully; raise ``HttpError`` unless it holds ``tokens`` words of text
        (streamed: as exactly ``tokens`` text events)."""
        if not stream:
            text = self.text_of(json.loads(body))
            if len(text.split()) != tokens:
                raise HttpError(f"unexpected reply: {body[:300]!r}")
            return {"events": 1, "text_events": 1, "words": tokens}
        events = self.text_events(body)
        if events != tokens:
            raise HttpError(f"{events} text events, expected {tokens}")
        return {"events": len(_events(body)), "text_events": events}


def _chat_text(reply: dict[str, Any]) -> str:
    return str(reply["choices"][0]["message"]["content"])


def _messages_text(reply: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in reply["content"] if b["type"] == "text")


def _responses_text(reply: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in reply["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


def _chat_events(body: bytes) -> int:
    done = [e for e in _events(body) if e.strip() == b"data: [DONE]"]
    if len(done) != 1:
        raise HttpError("stream not ended by [DONE]")
    return sum(
        1
        for e in _events(body)
        if e.strip() != b"data: [DONE]"
        for c in _data(e).get("choices") or []
        if (c.get("delta") or {}).get("content")
    )


APIS = {
    "chat": Api(
        "chat",
        "/v1/chat/completions",
        chat_body,
        b"data: [DONE]",
        b'"choices"',
        b'"error"',
        _chat_events,
        _chat_text,
    ),
    "messages": Api(
        "messages",
        "/v1/messages",
        messages_body,
        b'data: {"type":"message_stop"',
        b'"content"',
        b'"type":"error"',
        lambda body: _count(body, lambda d: (d.get("delta") or {}).get("type") == "text_delta"),
        _messages_text,
    ),
    "responses": Api(
        "responses",
        "/v1/responses",
        responses_body,
        b'data: {"type":"response.completed"',
        b'"output"',
        b'"type":"response.failed"',
        lambda body: _count(body, lambda d: d.get("type") == "response.output_text.delta"),
        _responses_text,
    ),
}


def sized_chat(kb: int) -> Api:
    """Chat completions of about ``kb`` KB per body (``agent_chat_body``), named ``chat-<kb>k``."""
    return replace(
        APIS["chat"],
        name=f"chat-{kb}k",
        body=lambda session, call, stream: agent_chat_body(session, call, stream, kb * 1024),
    )
