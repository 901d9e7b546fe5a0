"""The SWE-style agent of ``swe_agent.py``, through LiteLLM's ``talaria/`` provider.

    .venv/bin/talaria serve --port 8000 --time-scale 50      # in another terminal
    LITELLM_LOCAL_MODEL_COST_MAP=True python examples/litellm_agent.py \\
        --base-url http://127.0.0.1:8000/v1

``talaria.sdk.litellm.register()`` adds the provider to ``litellm.custom_provider_map``;
``litellm.completion(model="talaria/<model>", api_base=...)`` then goes through
``talaria.sdk.OpenAI`` and joins the active ``session()`` scope, exactly like the plain SDK.
(``LITELLM_LOCAL_MODEL_COST_MAP=True`` keeps LiteLLM from downloading its price list; this
script sets it if unset.)
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from swe_agent import Complete, Reply, ToolCall, Workspace, arguments, run_agent, summary

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def litellm_complete(model: str, base_url: str, api_key: str) -> Complete:
    """A ``Complete`` over ``litellm.completion`` with the ``talaria/`` provider."""
    import litellm

    def complete(
        messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, forced: str | None
    ) -> Reply:
        extra: dict[str, Any] = {"tools": tools} if tools else {}
        if forced is not None:
            extra["tool_choice"] = {"type": "function", "function": {"name": forced}}
        reply = litellm.completion(
            model=f"talaria/{model}",
            messages=messages,
            api_base=base_url,
            api_key=api_key,
            max_tokens=256,
            **extra,
        )
        message = reply.choices[0].message
        calls = [
            ToolCall(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []
        ]
        as_dict: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
        if calls:
            as_dict["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in calls
            ]
        return Reply(as_dict, calls, message.content or "")

    return complete


def main() -> None:
    from talaria.sdk import session
    from talaria.sdk.litellm import register

    args = arguments("The SWE-style agent through LiteLLM's talaria/ provider.")
    register()
    complete = litellm_complete(args.model, args.base_url, args.api_key)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, session() as s:
        print(f"session {s.id} against {args.base_url} (talaria/{args.model} via LiteLLM)")

        def hint(tool: str, expected_s: float) -> None:
            s.tool_gap(expected_s=expected_s, tool=tool)

        outcome = run_agent(complete, Workspace(Path(tmp)), args.steps, hint)
    summary(s, outcome, time.monotonic() - started, args.json)


if __name__ == "__main__":
    main()
