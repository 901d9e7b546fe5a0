"""The worst event-loop lag one hostile request causes on the proxy, per API and body shape, with
its body filled to the proxy's body limit (docs/operations.md, "Bounds, quotas and timeouts").

    .venv/bin/python bench/loop_lag.py [--repeats 3] [--only messages] [--json out/loop-lag.json]

The proxy runs in this process as ``talaria serve`` runs it (bench/harness/lag.py: its app and
bounded HTTP edge, uvloop, the start-up objects frozen; an embedded simulated node of
``MODEL``, SQLite in a temporary folder), with a probe in its event loop that sleeps 1 ms again
and again and notes how late each wake-up comes. Each shape of bench/harness/hostile.py (tiny
messages, content parts, tools, stop sequences, ...), its body filled to
``TALARIA_MAX_REQUEST_BYTES`` (8 MiB by default), is sent ``--repeats`` times, one request at
a time, from the main thread (the bodies are encoded before the probe is reset). The lag of a
request is the probe's worst from just before it is sent to ``SETTLE_S`` after its answer, so
the work it leaves behind (its records, the release of its body) counts too. Reports, per
shape: the elements, the body's bytes, the answer's status and code, the worst lag over the
repeats and the slowest answer.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/harness

import httpx
import msgspec

from bench.harness.hostile import HI, SHAPES, fill, largest_accepted
from bench.harness.lag import InProcessProxy, proxy_in_thread
from talaria.cli.common import progress_bar
from talaria.proxy.callpath.bounds import check_request, check_structure
from talaria.proxy.contract.errors import ApiError

MODEL = "qwen3-coder-480b-a35b-fp8"
"""The catalog's largest context window (262,144 tokens): the most of a body is admitted."""
TIME_SCALE = 200.0
"""Simulated seconds per wall second: the replies the simulated engine times come quickly."""
SETTLE_S = 0.2
"""How long after an answer the probe keeps counting (the records' writer flushes every 50 ms)."""


def _code(response: httpx.Response) -> str:
    """The error's code (or Anthropic's error type), empty for a success."""
    if response.is_success:
        return ""
    try:
        error = response.json().get("error", {})
    except ValueError:
        return "?"
    return str(error.get("code") or error.get("type") or "")


def accepted_by_bounds(body: bytes) -> bool:
    """Whether the proxy's body bounds (proxy/callpath/bounds.py) let ``body`` through to its
    validation."""
    try:
        check_structure(body)
        decoded = msgspec.json.decode(body)
        if isinstance(decoded, dict):
            check_request(decoded)
    except ApiError:
        return False
    return True


def _send(
    http: httpx.Client, proxy: InProcessProxy, path: str, body: bytes, repeats: int
) -> dict[str, Any]:
    """``body`` sent ``repeats`` times: the last answer's status and code, the worst lag and
    the slowest answer."""
    worst_s, slowest_s, answer = 0.0, 0.0, None
    for _ in range(repeats):
        proxy.reset()
        started = time.perf_counter()
        answer = http.post(path, content=body, headers={"content-type": "application/json"})
        slowest_s = max(slowest_s, time.perf_counter() - started)
        time.sleep(SETTLE_S)
        worst_s = max(worst_s, proxy.worst_lag_s())
    assert answer is not None
    return {
        "status": answer.status_code,
        "code": _code(answer),
        "worst_lag_ms": round(worst_s * 1000, 1),
        "answer_s": round(slowest_s, 3),
    }


def measure(repeats: int, only: str | None) -> list[dict[str, Any]]:
    """One row per shape: at the body limit (its elements, bytes, answer, worst lag, slowest
    answer), and, when fewer, with the most elements the body bounds accept (the same)."""
    shapes = [s for s in SHAPES if only is None or only in s.label]
    rows: list[dict[str, Any]] = []
    with (
        proxy_in_thread(models=[MODEL], time_scale=TIME_SCALE) as proxy,
        httpx.Client(base_url=proxy.base_url, timeout=600) as http,
        progress_bar("shapes") as bar,
    ):
        task = bar.add_task("hostile bodies", total=len(shapes))
        http.post("/v1/chat/completions", json={"model": MODEL, "messages": HI})  # warm-up
        for shape in shapes:
            body, n = fill(shape, MODEL, proxy.max_request_bytes)
            row: dict[str, Any] = {"api": shape.api, "shape": shape.name}
            row["limit"] = {"elements": n, "bytes": len(body)}
            row["limit"] |= _send(http, proxy, shape.path, body, repeats)
            accepted = largest_accepted(shape, MODEL, n, accepted_by_bounds)
            if shape.scaled and accepted is not None and accepted[1] < n:
                body, n = accepted
                row["accepted"] = {"elements": n, "bytes": len(body)}
                row["accepted"] |= _send(http, proxy, shape.path, body, repeats)
            rows.append(row)
            bar.advance(task)
    return rows


def _cells(found: dict[str, Any] | None) -> str:
    if found is None:
        return " |"
    answer = f"{found['status']} {found['code']}".strip()
    return f" {found['elements']:,}: {answer} | {found['worst_lag_ms']:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="requests per shape")
    parser.add_argument("--only", help="only the shapes whose 'api: shape' label holds this")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = measure(args.repeats, args.only)
    print(
        "| API | body | at the body limit: elements, answer | worst lag ms "
        "| the most the bounds accept | worst lag ms |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['api']} | {r['shape']} |{_cells(r['limit'])} |{_cells(r.get('accepted'))} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
