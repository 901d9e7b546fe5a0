"""A small SWE-style agent in one Talaria session: ask the model, run a shell tool, feed the
output back, for a bounded number of steps.

    .venv/bin/talaria serve --port 8000 --time-scale 50      # in another terminal
    python examples/swe_agent.py --base-url http://127.0.0.1:8000/v1

The tools work in a temporary directory: ``write_file``, ``ls``, ``cat`` and ``run_python``
(a tiny test). The agent scripts its plan: each step names the planned tool in ``tool_choice``
(so any model, Talaria's simulated engine included, calls it) and runs it with the planned
arguments, then asks for a final answer without tools. What matters is the rhythm —
call, tool, call with the same history plus a little more — and the session plumbing:
``talaria.sdk.OpenAI`` + ``session()`` put every call in one session, learn its tool gaps,
hint the slow tool, and end the session on exit. Prints the session id, the steps and the
session completion time (SCT).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TEST_FILE = "test_add.py"
TEST_SOURCE = """\
def add(a, b):
    return a + b


assert add(2, 3) == 5
print("1 passed")
"""


def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    properties = {p: {"type": "string", "description": d} for p, d in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(params)},
        },
    }


TOOLS = {
    "write_file": _tool("write_file", "Write a file.", path="file path", content="file content"),
    "ls": _tool("ls", "List the working directory."),
    "cat": _tool("cat", "Print a file.", path="file path"),
    "run_python": _tool("run_python", "Run a Python file.", path="file path"),
}
PLAN: list[tuple[str, dict[str, str]]] = [
    ("write_file", {"path": TEST_FILE, "content": TEST_SOURCE}),
    ("ls", {}),
    ("cat", {"path": TEST_FILE}),
    ("run_python", {"path": TEST_FILE}),
]
"""The scripted steps: (tool, arguments); repeated when more steps are asked for."""
SLOW_TOOLS = {"run_python": 2.0}
"""Tools worth an explicit hint, with their expected seconds."""


class Workspace:
    """A temporary directory and the shell tools that work in it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, args: dict[str, str]) -> Path:
        path = (self.root / args.get("path", TEST_FILE)).resolve()
        if self.root.resolve() not in path.parents:
            raise ValueError(f"path outside the workspace: {path}")
        return path

    def _run(self, argv: list[str]) -> str:
        done = subprocess.run(
            argv, cwd=self.root, capture_output=True, text=True, timeout=60, check=False
        )
        return (done.stdout + done.stderr).strip() or f"(exit {done.returncode})"

    def run(self, tool: str, args: dict[str, str]) -> str:
        """Run ``tool``; its output (errors included) is what the model sees."""
        try:
            if tool == "write_file":
                path = self._path(args)
                path.write_text(args.get("content", ""))
                return f"wrote {path.name} ({path.stat().st_size} bytes)"
            if tool == "ls":
                return self._run(["ls", "-1"])
            if tool == "cat":
                return self._run(["cat", str(self._path(args))])
            if tool == "run_python":
                return self._run([sys.executable, str(self._path(args))])
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            return f"error: {exc}"
        return f"error: unknown tool {tool}"


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass
class Reply:
    """What the agent needs from one model reply."""

    message: dict[str, Any]
    tool_calls: list[ToolCall]
    text: str


Complete = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, str | None], Reply]
"""(messages, tools or None, the tool the model must call or None) -> the model's reply."""


@dataclass
class Outcome:
    steps: list[str] = field(default_factory=list)
    answer: str = ""


def run_agent(
    complete: Complete,
    workspace: Workspace,
    steps: int,
    on_slow_tool: Callable[[str, float], None] | None = None,
) -> Outcome:
    """The agent loop: ``steps`` tool steps, then a final answer without tools."""
    outcome = Outcome()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {"role": "user", "content": f"Write {TEST_FILE} with a tiny test of add() and run it."},
    ]
    for step in range(steps):
        planned_tool, planned_args = PLAN[step % len(PLAN)]
        reply = complete(messages, list(TOOLS.values()), planned_tool)
        messages.append(reply.message)
        if not reply.tool_calls:
            outcome.answer = reply.text
            return outcome
        for call in reply.tool_calls:
            args = planned_args if call.name == planned_tool else {}
            if on_slow_tool is not None and call.name in SLOW_TOOLS:
                on_slow_tool(call.name, SLOW_TOOLS[call.name])
            output = workspace.run(call.name, args)
            outcome.steps.append(call.name)
            print(f"  step {len(outcome.steps)}: {call.name} -> {output.splitlines()[0][:60]}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    outcome.answer = complete(messages, None, None).text
    return outcome


def openai_complete(client: Any, model: str) -> Complete:
    """A :data:`Complete` over an OpenAI-style client (``talaria.sdk.OpenAI``)."""

    def complete(
        messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, forced: str | None
    ) -> Reply:
        extra: dict[str, Any] = {"tools": tools} if tools else {}
        if forced is not None:
            extra["tool_choice"] = {"type": "function", "function": {"name": forced}}
        reply = client.chat.completions.create(
            model=model, messages=messages, max_tokens=256, **extra
        )
        message = reply.choices[0].message
        calls = [
            ToolCall(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []
        ]
        return Reply(message.model_dump(exclude_none=True), calls, message.content or "")

    return complete


def arguments(description: str) -> argparse.Namespace:
    """The examples' common command line."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--base-url", default=os.environ.get("TALARIA_BASE_URL", "http://127.0.0.1:8000/v1")
    )
    parser.add_argument("--api-key", default=os.environ.get("TALARIA_API_KEY", "local"))
    parser.add_argument("--model", default="glm-4.5-fp8")
    parser.add_argument("--steps", type=int, default=len(PLAN), help="tool steps (bounded)")
    parser.add_argument("--json", action="store_true", help="end with a JSON summary line")
    return parser.parse_args()


def summary(session: Any, outcome: Outcome, wall_s: float, as_json: bool) -> None:
    """Print the session's id, steps, calls and SCT (and the JSON line when asked)."""
    sct = session.sct_s or 0.0
    print(f"session {session.id}: {len(outcome.steps)} tool steps, {session.calls} calls")
    print(f"SCT {sct:.2f} s (wall {wall_s:.2f} s); tool gaps seen {len(session.gaps_s)}")
    if as_json:
        fields = {"session_id": session.id, "steps": outcome.steps, "calls": session.calls}
        print(json.dumps({**fields, "sct_s": sct, "gaps": len(session.gaps_s)}))


def main() -> None:
    from talaria.sdk import OpenAI, session

    args = arguments("A small SWE-style agent in one Talaria session.")
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, session() as s:
        print(f"session {s.id} against {args.base_url} ({args.model})")

        def hint(tool: str, expected_s: float) -> None:
            s.tool_gap(expected_s=expected_s, tool=tool)

        outcome = run_agent(
            openai_complete(client, args.model), Workspace(Path(tmp)), args.steps, hint
        )
    summary(s, outcome, time.monotonic() - started, args.json)


if __name__ == "__main__":
    main()
