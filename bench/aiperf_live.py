"""NVIDIA's aiperf against ``talaria serve``: its coding-agent sessions (``aiperf synthesize
agentic-code``), replayed at several concurrencies on chat completions and Anthropic Messages,
read back from aiperf's export and Talaria's admin API.

    bash scripts/aiperf-venv.sh && bash scripts/real-model.sh   # aiperf; the model directory
    .venv-vllm/bin/python bench/aiperf_live.py --model-dir DIR \\
        [--sessions 8] [--concurrency 1,2,4] [--endpoints chat,messages] [--json out/aiperf.json]
    .venv/bin/python bench/aiperf_live.py --url URL --admin-token T --model NAME --model-dir DIR

Without ``--url`` it starts ``talaria serve --model smollm2=DIR`` (vLLM's CPU build: run it with
.venv-vllm's python) with an admin token. ``DIR`` is a model directory (its tokenizer files
build aiperf's prompts, offline: bench/harness/aiperf.py). The sessions' shape is
bench/aiperf/agentic-small.json (``--config`` for another): the generator's layers (a system
layer every session shares, a group layer, a session's own start, then its growth turn by
turn) scaled to a 135M model on 2 cores, tool delays compressed to a fraction of a second.
Every run (endpoint × concurrency) replays its own seed's sessions, so no run finds another's
prefixes.

Per run: requests and errors (aiperf's); aiperf's sessions (one per ``x-session-affinity`` id)
and how many came out as one Talaria session holding all their calls; the cached share of
those sessions' prompt tokens (Talaria's admin API); TTFT and request latency p50 / p95 and
request throughput (aiperf's summary).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.aiperf import (
    AGENTIC_SMALL,
    Aiperf,
    aiperf_binary,
    matched,
    requests,
    summary,
    talaria_sessions,
)
from bench.harness.processes import talaria_serve

ADMIN = "aiperf-bench-admin-token"


def one_run(
    aiperf: Aiperf, base: str, token: str, model: str, tokenizer: str, run: dict[str, Any]
) -> dict[str, Any]:
    """One endpoint at one concurrency: aiperf's figures and Talaria's view of its sessions."""
    name = f"{run['endpoint']}-c{run['concurrency']}"
    dataset = aiperf.synthesize(run["sessions"], run["seed"], run["config"])
    art = aiperf.profile(base, model, tokenizer, dataset, name, run["endpoint"], run["concurrency"])
    sent = requests(art)
    stored = talaria_sessions(base, token)
    found = matched(sent, stored)
    mine = [s for s in stored if s["session_id"] in found]
    prompt = sum(s["prompt_tokens"] for s in mine)
    doc = summary(art)

    def stat(metric: str, key: str) -> float | None:
        value = (doc.get(metric) or {}).get(key)
        return float(value) if value is not None else None

    return {
        "run": name,
        "requests": len(sent),
        "errors": sum(r.error is not None for r in sent),
        "error_samples": [r.error for r in sent if r.error][:3],
        "sessions": len(found),
        "sessions_whole": sum(m.whole for m in found.values()),
        "cached_share": sum(s["cached_tokens"] for s in mine) / prompt if prompt else None,
        "ttft_p50_ms": stat("time_to_first_token", "p50"),
        "ttft_p95_ms": stat("time_to_first_token", "p95"),
        "latency_p50_ms": stat("request_latency", "p50"),
        "latency_p95_ms": stat("request_latency", "p95"),
        "throughput_rps": stat("request_throughput", "avg"),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'run':<14} {'req':>4} {'err':>4} {'sessions':>9} {'cached':>7} "
        f"{'TTFT p50':>9} {'TTFT p95':>9} {'lat p50':>8} {'lat p95':>8} {'req/s':>6}"
    ]
    for r in rows:
        share = f"{r['cached_share']:.1%}" if r["cached_share"] is not None else "-"
        ttft50, ttft95, lat50, lat95 = (
            (r[k] or 0) / 1000
            for k in ("ttft_p50_ms", "ttft_p95_ms", "latency_p50_ms", "latency_p95_ms")
        )
        lines.append(
            f"{r['run']:<14} {r['requests']:>4} {r['errors']:>4} "
            f"{r['sessions_whole']:>4}/{r['sessions']:<4} {share:>7} "
            f"{ttft50:>8.2f}s {ttft95:>8.2f}s {lat50:>7.2f}s {lat95:>7.2f}s "
            f"{r['throughput_rps'] or 0:>6.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model-dir", type=Path, required=True, help="its tokenizer builds the prompts"
    )
    parser.add_argument("--url", help="a running talaria serve (default: start one)")
    parser.add_argument("--admin-token", default=ADMIN, help="with --url: its admin token")
    parser.add_argument("--model", default="smollm2", help="the served model's name")
    parser.add_argument("--sessions", type=int, default=8, help="sessions per run")
    parser.add_argument("--concurrency", default="1,2,4", help="comma-separated")
    parser.add_argument("--endpoints", default="chat,messages", help="chat, messages, responses")
    parser.add_argument("--config", type=Path, default=AGENTIC_SMALL, help="generator config")
    parser.add_argument("--seed", type=int, default=0, help="the first run's seed")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    binary = aiperf_binary()
    if binary is None:
        parser.error("no aiperf: bash scripts/aiperf-venv.sh (or set TALARIA_AIPERF)")
    if not (args.model_dir / "tokenizer.json").is_file():
        parser.error(f"{args.model_dir} has no tokenizer.json")
    rows = []
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="talaria-aiperf-")))
        aiperf = Aiperf(binary, folder)
        base, token = args.url, args.admin_token
        if base is None:
            serve_args = ["--model", f"{args.model}={args.model_dir}"]
            env = {"TALARIA_ADMIN_TOKEN": ADMIN, "HF_HUB_OFFLINE": "1",
                   "VLLM_CPU_KVCACHE_SPACE": "1"}  # fmt: skip
            served = stack.enter_context(
                talaria_serve(serve_args, env, folder / "data", startup_s=300)
            )
            base, token = served.base_url, ADMIN
        tokenizer = aiperf.tokenizer(args.model_dir)
        seed = args.seed
        for endpoint in args.endpoints.split(","):
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                run = {"endpoint": endpoint, "concurrency": concurrency, "seed": seed,
                       "sessions": args.sessions, "config": args.config}  # fmt: skip
                rows.append(one_run(aiperf, base, token, args.model, tokenizer, run))
                print(json.dumps(rows[-1]), flush=True)
                seed += 1
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"sessions": args.sessions, "runs": rows}, indent=2))
    print(table(rows))


if __name__ == "__main__":
    main()
