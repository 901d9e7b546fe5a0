"""What a schema in a request can cost the event loop now (core/schema_instance.py's budget,
one for all of a request's schemas): the time to build the largest instances the budget allows,
to refuse the bombs (1,000 tools of 4,000 items each among them: one budget for the request),
and to check the tool sets real agents send (docs/operations.md, "Bounds, quotas and
timeouts").

    .venv/bin/python bench/schema_bomb.py [--repeats 20]

Each figure is the median of ``--repeats`` timings (``perf_counter``) of one
``check_schemas`` call, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from talaria.core.calls import ToolSpec
from talaria.core.schema_instance import (
    MAX_INSTANCE_CHARS,
    MAX_INSTANCE_VALUES,
    SchemaTooLarge,
    check_schemas,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "agent_tools"

CASES: dict[str, Any] = {
    "largest array within the budget": {
        "type": "array",
        "minItems": MAX_INSTANCE_VALUES - 2,
        "items": {"type": "integer"},
    },
    "largest string within the budget": {"type": "string", "minLength": MAX_INSTANCE_CHARS},
    "bomb: minItems 1e9": {"type": "array", "minItems": 10**9, "items": {"type": "string"}},
    "bomb: nested minItems 5000 × 5000": {
        "type": "array",
        "minItems": 5000,
        "items": {"type": "array", "minItems": 5000, "items": {"type": "integer"}},
    },
    "bomb: $ref requiring itself 40 times": {
        "$defs": {
            "n": {
                "type": "object",
                "required": [f"k{i}" for i in range(40)],
                "properties": {f"k{i}": {"$ref": "#/$defs/n"} for i in range(40)},
            }
        },
        "$ref": "#/$defs/n",
    },
}


def _median_ms(tools: list[ToolSpec], repeats: int) -> tuple[float, str]:
    times, outcome = [], "built"
    for _ in range(repeats):
        start = time.perf_counter()
        try:
            check_schemas(tools, None, "response_format")
        except SchemaTooLarge:
            outcome = "refused"
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000, outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    rows: list[tuple[str, float, str]] = []
    for name, schema in CASES.items():
        rows.append((name, *_median_ms([ToolSpec("t", parameters=schema)], args.repeats)))
    near = {"type": "array", "minItems": 4000, "items": {"type": "integer"}}
    near_budget = {"type": "object", "required": ["xs"], "properties": {"xs": near}}
    tools = [ToolSpec(f"t{i}", parameters=near_budget) for i in range(1000)]
    rows.append(("1,000 tools of 4,000 items each (one request)", *_median_ms(tools, args.repeats)))
    for agent in ("claude-code", "codex", "qwen-code"):
        tools = json.loads((FIXTURES / f"{agent}.json").read_text())
        specs = [
            ToolSpec(t["name"], parameters=t.get("input_schema") or t.get("parameters") or {})
            for t in tools
        ]
        rows.append((f"{agent}'s {len(specs)} tools", *_median_ms(specs, args.repeats)))
    print(f"| schema | outcome | ms (median of {args.repeats}) |\n|---|---|---|")
    for name, ms, outcome in rows:
        print(f"| {name} | {outcome} | {ms:.3f} |")


if __name__ == "__main__":
    main()
