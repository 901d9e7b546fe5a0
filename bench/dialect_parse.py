"""How long a dialect takes to turn an agent's request body into a ``Call``: validation by its
pydantic models and the conversion, per API, on bodies shaped like a coding agent's turn
(a long system prompt, 20 tools, a history of tool calls and results).

    .venv/bin/python bench/dialect_parse.py [--messages 40] [--repeat 200]

Prints the median microseconds per parse for chat, messages and responses. Run it on two
checkouts (``PYTHONPATH=<other checkout>``) to compare them; docs/proxy-overhead.md has the
figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

TOOL_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["path"],
}


def chat_body(turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " * 200},
        {"role": "user", "content": "Fix the failing test in the repository."},
    ]
    for i in range(turns):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "read_file",
                "arguments": json.dumps({"path": f"src/m{i}.py"})}}  # fmt: skip
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "x = 1\n" * 50})
    tools = [
        {"type": "function", "function": {"name": f"tool_{k}", "description": "a tool",
         "parameters": TOOL_SCHEMA}} for k in range(20)
    ]  # fmt: skip
    return {"model": "m", "messages": messages, "tools": tools, "stream": True}


def messages_body(turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Fix the failing test."}]}
    ]
    for i in range(turns):
        messages.append({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "look at the file", "signature": "s"},
            {"type": "tool_use", "id": f"t{i}", "name": "Read", "input": {"path": f"m{i}.py"}},
        ]})  # fmt: skip
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"t{i}", "content": "x = 1\n" * 50},
        ]})  # fmt: skip
    tools = [{"name": f"tool_{k}", "description": "a tool", "input_schema": TOOL_SCHEMA}
             for k in range(20)]  # fmt: skip
    return {
        "model": "m",
        "max_tokens": 4096,
        "system": [{"type": "text", "text": "You are Claude Code. " * 200}],
        "messages": messages,
        "tools": tools,
        "stream": True,
    }


def responses_body(turns: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Fix the failing test."}]}
    ]  # fmt: skip
    for i in range(turns):
        items.append({"type": "function_call", "call_id": f"c{i}", "name": "shell",
                      "arguments": json.dumps({"command": ["cat", f"m{i}.py"]})})  # fmt: skip
        items.append({"type": "function_call_output", "call_id": f"c{i}", "output": "x\n" * 50})
    tools = [{"type": "function", "name": f"tool_{k}", "description": "a tool",
              "parameters": TOOL_SCHEMA} for k in range(20)]  # fmt: skip
    return {"model": "m", "instructions": "You are Codex. " * 200, "input": items,
            "tools": tools, "stream": True, "store": False}  # fmt: skip


def parsers() -> dict[str, Callable[[dict[str, Any]], object]]:
    """The parse of each API, from whichever layout this checkout has."""
    try:
        from talaria.proxy.dialects.anthropic.parse import parse_messages
        from talaria.proxy.dialects.chat.parse import parse_chat
        from talaria.proxy.dialects.responses.parse import parse_request, to_call
    except ImportError:  # the layout before the dialects' folders
        from talaria.proxy.dialects.anthropic import parse_messages  # type: ignore
        from talaria.proxy.dialects.chat import parse_chat  # type: ignore
        from talaria.proxy.dialects.responses import parse_request, to_call  # type: ignore
    return {
        "chat": parse_chat,
        "messages": parse_messages,
        "responses": lambda body: to_call(parse_request(body, "r"), []),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--messages", type=int, default=40, help="history messages (tool turns × 2)"
    )
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    turns = args.messages // 2
    bodies = {"chat": chat_body(turns), "messages": messages_body(turns),
              "responses": responses_body(turns)}  # fmt: skip
    for api, parse in parsers().items():
        body = bodies[api]
        for _ in range(10):
            parse(body)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            parse(body)
            times.append(time.perf_counter() - start)
        size = len(json.dumps(body))
        print(f"{api:10} {size / 1000:7.1f} kB  median {statistics.median(times) * 1e6:8.1f} µs")


if __name__ == "__main__":
    main()
