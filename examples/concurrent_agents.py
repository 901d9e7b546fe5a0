"""Twenty agent sessions at once (``AsyncOpenAI`` and asyncio), each in its own Talaria
session; prints each session's completion time (SCT) and the p50 / p95.

    .venv/bin/talaria serve --port 8000 --time-scale 50      # in another terminal
    python examples/concurrent_agents.py --base-url http://127.0.0.1:8000/v1

Each agent calls the model with a tool offered, "runs" the tool (an asyncio sleep of a few
tens of milliseconds, standing in for a shell command), and calls again with the history
grown by the reply and the tool output, for ``--steps`` steps, then answers without tools.
Every agent opens its own ``async with session()``: the scope lives in a ContextVar, so the
concurrent tasks never mix their sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
from typing import Any

from talaria.sdk import AsyncOpenAI, session

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


async def agent(
    client: AsyncOpenAI, model: str, index: int, steps: int, rng: random.Random
) -> dict[str, Any]:
    """One agent: ``steps`` call/tool rounds and a final answer, in one session."""
    tool_s = [rng.uniform(0.01, 0.08) for _ in range(steps)]
    async with session() as s:
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": f"Task {index}: find and fix the failing test."}
        ]
        for step in range(steps):
            reply = await client.chat.completions.create(
                model=model, messages=messages, tools=TOOLS, max_tokens=128
            )
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls or []:
                await asyncio.sleep(tool_s[step])  # the tool runs
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": f"ran step {step}"}
                )
        await client.chat.completions.create(model=model, messages=messages, max_tokens=64)
    sct = s.sct_s or 0.0
    print(f"agent {index:2d}  session {s.id}  calls {s.calls}  SCT {sct:.2f} s")
    return {"session_id": s.id, "calls": s.calls, "sct_s": sct}


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1), nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    async with AsyncOpenAI(base_url=args.base_url, api_key=args.api_key) as client:
        jobs = [
            agent(client, args.model, i, args.steps, random.Random(rng.random()))
            for i in range(args.sessions)
        ]
        return list(await asyncio.gather(*jobs))


def main() -> None:
    parser = argparse.ArgumentParser(description="Concurrent agent sessions against Talaria.")
    parser.add_argument(
        "--base-url", default=os.environ.get("TALARIA_BASE_URL", "http://127.0.0.1:8000/v1")
    )
    parser.add_argument("--api-key", default=os.environ.get("TALARIA_API_KEY", "local"))
    parser.add_argument("--model", default="glm-4.5-fp8")
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="end with a JSON summary line")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    scts = [r["sct_s"] for r in results]
    p50, p95 = statistics.median(scts), percentile(scts, 0.95)
    print(f"{len(scts)} sessions: SCT p50 {p50:.2f} s, p95 {p95:.2f} s")
    if args.json:
        print(json.dumps({"sessions": results, "p50_s": p50, "p95_s": p95}))


if __name__ == "__main__":
    main()
