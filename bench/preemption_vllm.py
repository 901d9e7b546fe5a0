"""Rule 5 on real vLLM (issue 49, part 4): what holding batch calls buys an interactive call.

    bash scripts/vllm-venv.sh
    .venv-vllm/bin/python bench/preemption_vllm.py                   # ~4 min
    .venv-vllm/bin/python bench/preemption_vllm.py --batch 8 --json out/preemption-vllm.json
    .venv-vllm/bin/python bench/preemption_vllm.py --engine-only      # no server, no rule

Every part is a real process on loopback: ``talaria runtime`` with one model on vLLM's CPU
build (the shipped random-weight ``tiny-llama-a``, or ``--model-path`` for a model directory of
your own; a model with a Hugging Face tokenizer, such as a real trained one, is served through
vLLM's chat layer, where a held call is resumed from its text: chat_generate.py ``chat``) and
``talaria serve`` in front of it,
with an API key per tenant (``bulk`` batch, ``ide`` interactive). Three runs, fresh processes
each:

1. ``alone``: the interactive turns with nothing else running;
2. ``no holds``: the same turns while ``--batch`` batch calls stream (the node's
   ``preempt_limit = 0``: rule 5 off; rule 4 still keeps *new* batch calls out, so every batch
   call is started before the first turn);
3. ``holds``: the same, ``preempt_limit = 10`` (the default): a batch call whose company would
   slow the interactive call's decode step past ``class_slowdown`` × its step alone (by the
   engine's decode-step estimate) is aborted and resubmitted with its output once the turn
   has ended (runtime/engines/class_holds.py).

Each run is ``--rounds`` rounds with fresh sessions: the batch calls start, and once each has
streamed its first text an interactive session takes turns (``--gap-s`` of tool time apart)
while any batch call still runs. Printed per run: the turns that ended with a batch call still
running, their p50 / p90 latency and p50 time to first token (wall seconds; ``alone``: every
turn), the batch's median completion time (the last call's end, from the round's start), the
preemptions the runtime's status counts; the JSON also says whether every batch call counted
all its tokens. Every process is stopped on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.processes import talaria_runtime, talaria_serve, tenant_key
from talaria.runtime.scheduling.config import SchedulerConfig

MODEL = "tiny-a"
DEFAULTS = SchedulerConfig()
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


def log(message: str) -> None:
    print(f"[preemption-vllm {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def node_toml(path: str, preempt_limit: int, class_slowdown: float, profile: str | None) -> str:
    """One vLLM model on a fair-queue node with rule 5's bounds (and a calibrated profile:
    the engine's decode-step estimate is then its fit, else ``RateModel``'s defaults)."""
    calibrated = f'server = "cpu-vllm"\nprofile = "{profile}"' if profile else ""
    return f"""
[node]
name = "preempt"
policy = "talaria"
quantum_s = 30
class_slowdown = {class_slowdown}
preempt_limit = {preempt_limit}
{calibrated}

[[model]]
name = "{MODEL}"
engine = "vllm"
path = "{path}"
max_model_len = 2048
"""


def create_keys(url: str) -> dict[str, str]:
    """An API key per tenant: ``bulk`` batch, ``ide`` interactive."""
    return {
        tenant: tenant_key(url, tenant, "--priority", priority)
        for tenant, priority in (("bulk", "batch"), ("ide", "interactive"))
    }


async def batch_call(
    client: openai.AsyncOpenAI, index: str, tokens: int, streaming: asyncio.Event, stream: bool
) -> tuple[float, int]:
    """One batch call, streamed or not: (the wall time it ended, its completion tokens).
    ``streaming`` is set at its first piece of text (not streamed: at once)."""
    messages = [{"role": "user", "content": f"batch job {index}: " + "summarise this. " * 40}]
    common: dict[str, Any] = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": tokens,
        "extra_body": {"ignore_eos": True},
        "extra_headers": {"x-talaria-session-id": f"bulk-{index}"},
    }
    if not stream:
        streaming.set()
        reply = await client.chat.completions.create(**common)
        return time.perf_counter(), reply.usage.completion_tokens if reply.usage else 0
    chunks = await client.chat.completions.create(
        **common, stream=True, stream_options={"include_usage": True}
    )
    counted = 0
    async for chunk in chunks:
        if any(c.delta.content for c in chunk.choices):
            streaming.set()
        if chunk.usage is not None:
            counted = chunk.usage.completion_tokens
    return time.perf_counter(), counted


async def turn(
    client: openai.AsyncOpenAI, session: str, index: int, tokens: int
) -> tuple[float, float]:
    """One interactive turn, streamed: (latency, time to first token), wall seconds."""
    start = time.perf_counter()
    first = None
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"fix the failing test, turn {index}"}],
        max_tokens=tokens,
        stream=True,
        extra_body={"ignore_eos": True},
        extra_headers={"x-talaria-session-id": session},
    )
    async for chunk in stream:
        if first is None and any(c.delta.content for c in chunk.choices):
            first = time.perf_counter() - start
    return time.perf_counter() - start, first if first is not None else float("nan")


async def round_(
    bulk: openai.AsyncOpenAI, ide: openai.AsyncOpenAI, args: argparse.Namespace, batch: int, n: int
) -> tuple[list[tuple[float, float]], float | None, bool]:
    """Round ``n``: ``batch`` batch calls start; once each has its first text, interactive
    turns (``gap_s`` apart) while any still runs, at most ``turns`` (alone: ``turns``). The
    turns that ended with a batch call still running, the batch's completion time (None
    alone), and whether every batch call counted all its tokens."""
    started = [asyncio.Event() for _ in range(batch)]
    t0 = time.perf_counter()
    calls = [
        asyncio.create_task(
            batch_call(bulk, f"{n}-{i}", args.batch_tokens, started[i], args.batch_stream)
        )
        for i in range(batch)
    ]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), timeout=300)
    turns = []
    for i in range(args.turns):
        if calls and all(c.done() for c in calls):
            break
        timed = await turn(ide, f"ide-{n}", i, args.turn_tokens)
        if not calls or not all(c.done() for c in calls):
            turns.append(timed)
        await asyncio.sleep(args.gap_s)  # the agent's tool runs
    ended = await asyncio.gather(*calls)
    done_s = max(e[0] for e in ended) - t0 if ended else None
    return turns, done_s, all(e[1] == args.batch_tokens for e in ended)


async def drive(
    base: str, keys: dict[str, str], args: argparse.Namespace, batch: int
) -> dict[str, Any]:
    """A warm-up turn, then ``rounds`` rounds (``round_``); their turns pooled."""
    bulk = openai.AsyncOpenAI(base_url=base, api_key=keys["bulk"], max_retries=0, timeout=600)
    ide = openai.AsyncOpenAI(base_url=base, api_key=keys["ide"], max_retries=0, timeout=600)
    await turn(ide, "warm-up", 0, 4)  # the engine's first steps build their kernels
    turns: list[tuple[float, float]] = []
    done: list[float] = []
    whole = True
    for n in range(args.rounds):
        more, done_s, all_tokens = await round_(bulk, ide, args, batch, n)
        turns += more
        done += [done_s] if done_s is not None else []
        whole = whole and all_tokens
    await bulk.close()
    await ide.close()
    latency = [t[0] for t in turns]
    return {
        "turns": len(turns),
        "turn_p50_s": statistics.median(latency),
        "turn_p90_s": float(np.percentile(latency, 90)),
        "ttft_p50_s": statistics.median(t[1] for t in turns),
        "batch_done_s": statistics.median(done) if done else None,
        "batch_all_tokens": whole,
    }


def run(args: argparse.Namespace, name: str, batch: int, preempt_limit: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        url = f"sqlite+aiosqlite:///{data / 'talaria.db'}"
        keys = create_keys(url)
        config = data / "node.toml"
        config.write_text(
            node_toml(args.model_path, preempt_limit, args.class_slowdown, args.profile)
        )
        log(f"{name}: starting the runtime (vLLM, ~30 s) and the proxy")
        extra = ("--catalog", str(args.catalog.resolve())) if args.catalog else ()
        with talaria_runtime(config, VLLM_ENV, extra) as runtime:
            env = {"TALARIA_DATABASE_URL": url}
            with talaria_serve(["--runtime", runtime.base_url], env, data) as proxy:
                result = asyncio.run(drive(proxy.v1, keys, args, batch))
            status = httpx.get(runtime.base_url + "/v1/runtime/status", timeout=30).json()
        result["preemptions"] = status["engines"][MODEL].get("preemptions", 0)
        log(f"{name}: {result}")
        return {"run": name, **result}


async def engine_only(args: argparse.Namespace) -> dict[str, float]:
    """The same turns on the vLLM engine alone, in this process (no runtime server, no proxy,
    no HTTP, no rule): ``turns`` turns alone, then ``turns`` beside ``batch`` batch calls (not
    streamed). Each turn's median latency, wall seconds."""
    from talaria.core.calls import Call
    from talaria.core.clock import LoopClock
    from talaria.core.types import CallRequest, Priority
    from talaria.runtime.engines.vllm import build_vllm_engine, tiny_model_dir

    clock = LoopClock()
    name = "tiny-llama-a"
    path = tiny_model_dir(name) if args.model_path == name else Path(args.model_path)
    engine = build_vllm_engine(path, name, clock, "cpu0", max_model_len=2048)

    def call(rid: str, priority: Priority, tokens: int, stream: bool) -> CallRequest:
        messages = ({"role": "user", "content": f"{rid}: " + "summarise this. " * 40},)
        return CallRequest(
            request_id=rid, session_key=rid, model=name, prompt_tokens=700,
            max_output_tokens=tokens, call_index=0, stream=stream,
            call=Call(name, messages=messages), priority=priority,
        )  # fmt: skip

    async def serve(request: CallRequest) -> float:
        admission = engine.try_admit(request, clock.now(), False)
        assert admission is not None
        start = time.perf_counter()
        async for _ in engine.run(admission):
            pass
        return time.perf_counter() - start

    await engine.start()
    await engine.activate()
    try:
        await serve(call("warm-up", Priority.INTERACTIVE, 4, True))
        alone = [
            await serve(call(f"alone-{i}", Priority.INTERACTIVE, args.turn_tokens, True))
            for i in range(args.turns)
        ]
        batch = [
            asyncio.create_task(serve(call(f"b-{i}", Priority.BATCH, args.batch_tokens, False)))
            for i in range(args.batch)
        ]
        beside = []
        for i in range(args.turns):
            if all(b.done() for b in batch):
                break
            timed = await serve(call(f"beside-{i}", Priority.INTERACTIVE, args.turn_tokens, True))
            if not all(b.done() for b in batch):
                beside.append(timed)
        await asyncio.gather(*batch)
    finally:
        await engine.shutdown()
    return {
        "alone_p50_s": statistics.median(alone),
        "beside_p50_s": statistics.median(beside),
        "beside_turns": len(beside),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8, help="batch calls streaming")
    parser.add_argument("--batch-tokens", type=int, default=768, help="each batch call's output")
    parser.add_argument("--turns", type=int, default=20, help="interactive turns a round, at most")
    parser.add_argument("--rounds", type=int, default=5, help="rounds a run (fresh sessions)")
    parser.add_argument("--turn-tokens", type=int, default=48, help="each turn's output")
    parser.add_argument("--gap-s", type=float, default=0.5, help="tool time between turns")
    parser.add_argument(
        "--batch-stream",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the batch calls stream (else each waits for its whole reply)",
    )
    parser.add_argument("--class-slowdown", type=float, default=DEFAULTS.class_slowdown)
    parser.add_argument(
        "--catalog", type=Path, help="a profile TOML written by `talaria calibrate` (its fit)"
    )
    parser.add_argument("--profile", help="the profile's name in --catalog")
    parser.add_argument("--model-path", default="tiny-llama-a", help="shipped name or directory")
    parser.add_argument(
        "--engine-only",
        action="store_true",
        help="the turns alone and beside the batch on the engine in this process (no server)",
    )
    parser.add_argument("--json", type=Path, help="write the runs here")
    args = parser.parse_args()
    if args.engine_only:
        timed = asyncio.run(engine_only(args))
        ratio = timed["beside_p50_s"] / timed["alone_p50_s"]
        print(
            f"engine only: turn p50 {timed['alone_p50_s']:.3f} s alone, "
            f"{timed['beside_p50_s']:.3f} s beside {args.batch} batch calls "
            f"({timed['beside_turns']} turns): {ratio:.2f}×"
        )
        return
    runs = [
        run(args, "alone", 0, DEFAULTS.preempt_limit),
        run(args, "no holds", args.batch, 0),
        run(args, "holds", args.batch, DEFAULTS.preempt_limit),
    ]
    alone = runs[0]["turn_p50_s"]
    print("| run | turns | turn p50 / p90 | TTFT p50 | ÷ alone (p50) | batch done | preemptions |")
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        done = f"{r['batch_done_s']:.1f} s" if r["batch_done_s"] is not None else "–"
        print(
            f"| {r['run']} | {r['turns']} | {r['turn_p50_s']:.2f} / {r['turn_p90_s']:.2f} s | "
            f"{r['ttft_p50_s']:.3f} s | {r['turn_p50_s'] / alone:.2f} | {done} | "
            f"{r['preemptions']} |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2, default=str))


if __name__ == "__main__":
    main()
