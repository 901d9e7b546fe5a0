"""The live runs of bench/fidelity/run.py: a fresh proxy on the calibrated runtime, one agent
per session driving it with the real ``openai`` client (closed loop, sleeping each tool gap),
and the proxy's store exported as the live trace."""

from __future__ import annotations

import asyncio
import random
import string
import subprocess
import time
from pathlib import Path
from typing import Any

import openai
from serving import TALARIA, Service, free_port, log

from talaria.core.trace import SessionTrace, read_trace


def words(rng: random.Random, n: int) -> str:
    """``n`` characters of lowercase words (one byte-tokenizer token each)."""
    out: list[str] = []
    size = 0
    while size < n:
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9)))
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:n]


async def drive(base_url: str, sessions: list[SessionTrace], text_seed: str) -> None:
    """One agent per session, closed loop: send, wait for the answer, sleep the tool gap. The
    words are drawn from ``text_seed`` (token counts come from the workload alone)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="fidelity", max_retries=0,
                                timeout=600)  # fmt: skip
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    done = 0

    async def agent(session: SessionTrace) -> None:
        nonlocal done
        rng = random.Random(f"{text_seed}/{session.session_id}")
        await asyncio.sleep(max(0.0, t0 + session.start_s - loop.time()))
        messages: list[Any] = []
        last = len(session.calls) - 1
        for i, call in enumerate(session.calls):
            messages.append({"role": "user", "content": words(rng, call.new_tokens)})
            headers = {"X-Talaria-Session-Id": session.session_id}
            if i == last:
                headers["X-Talaria-Session-Final"] = "true"
            reply = await client.chat.completions.create(
                model=session.model, messages=messages, max_tokens=call.output_tokens,
                extra_headers=headers,
            )  # fmt: skip
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            if call.tool_gap_s is not None:
                await asyncio.sleep(call.tool_gap_s)  # the tool runs
        done += 1
        log(f"session {session.session_id} done ({done}/{len(sessions)})")

    try:
        await asyncio.gather(*(agent(s) for s in sessions))
    finally:
        await client.close()


def repeat_dir(out: Path, repeat: int) -> Path:
    """Where live run ``repeat`` keeps its store and trace: OUT itself for the first."""
    return out if repeat == 0 else out / f"repeat-{repeat}"


def live_run(
    url: str, workload: list[SessionTrace], seed: int, repeat: int, where: Path
) -> tuple[list[SessionTrace], float]:
    """One live run of ``workload`` through a fresh proxy (its store ``where/live.db``) on the
    runtime at ``url``, exported to ``where/live.jsonl``; returns the trace and the run's wall
    seconds. Repeats draw other words (``drive``'s text seed), so that no repeat finds an
    earlier one's prompts in vLLM's prefix cache."""
    where.mkdir(parents=True, exist_ok=True)
    db = f"sqlite+aiosqlite:///{where / 'live.db'}"
    port = free_port()
    proxy = Service(
        "proxy",
        ["serve", "--runtime", url, "--port", str(port), "--database-url", db],
        where / "proxy.log",
    )
    try:
        calls = sum(s.num_calls for s in workload)
        log(f"live run {repeat}: driving {len(workload)} sessions, {calls} calls through the proxy")
        started = time.perf_counter()
        text_seed = str(seed) if repeat == 0 else f"{seed}/repeat-{repeat}"
        asyncio.run(drive(f"http://127.0.0.1:{port}/v1", workload, text_seed))
        seconds = time.perf_counter() - started
    finally:
        proxy.stop()
    trace_path = where / "live.jsonl"
    subprocess.run(
        [str(TALARIA), "trace", "export", "--db", db, "--out", str(trace_path)], check=True
    )
    return read_trace(trace_path), seconds
