"""Memory and lookup time of the proxy's live sessions at scale (issue 27).

    .venv/bin/python bench/session_memory.py [--sessions 100000] [--messages 8] \\
        [--json out/session-memory.json]

Fills one ``SessionBook`` (proxy/sessions/book.py: the sessions, their threads, the named
index and the conversation index, what a proxy replica holds per live session) with
``--sessions`` sessions, half named by their client (explicit ids) and half implicit, each after
one call of ``--messages`` messages (an agent's system prompt, its task, then tool rounds) and
the reply it got, as the gateway drives the book. Reports:

- RSS per live session: the process's resident memory (``/proc/self/statm``) after the fill
  less before it, over the sessions, after a full garbage collection; and the same read by
  ``tracemalloc`` for the book alone (Python objects only, no allocator slack);
- the conversation index's entries and the last-prompt digests each session keeps
  (``Thread.prompt``, 16-byte digests: they grow with a conversation's length);
- lookup time at that size: a continuation's ``resolve`` (its next call: the history plus a
  tool result) for implicit and explicit sessions picked at random, median and p99, with the
  cost of fingerprinting its messages (``Conversation.of``) apart.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from talaria.proxy.contract.identity import Identity
from talaria.proxy.sessions.book import SessionBook
from talaria.proxy.sessions.conversation import Conversation, fingerprint
from talaria.proxy.sessions.resolve import resolve

NOW = datetime(2026, 12, 3, tzinfo=UTC)
SYSTEM = "You are a coding agent. Use the tools to read, edit and test the repository. " * 20
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def messages(session: int, count: int) -> list[dict[str, Any]]:
    """An agent's conversation of ``count`` messages: system, task, then tool rounds."""
    out: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Task {session}: make tests/test_{session}.py pass."},
    ]
    step = 0
    while len(out) < count:
        arguments = f'{{"cmd": "pytest -k t{step}"}}'
        function = {"name": "bash", "arguments": arguments}
        call = {"id": f"c{step}", "type": "function", "function": function}
        out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        out.append({"role": "tool", "tool_call_id": f"c{step}", "content": f"ok {step} " * 40})
        step += 1
    return out[:count]


def reply(session: int) -> dict[str, Any]:
    return {"role": "assistant", "content": f"Running the tests of task {session}."}


def identity(session: int) -> Identity:
    """Even sessions are named by their client, odd ones implicit."""
    if session % 2 == 0:
        return Identity(f"agent-run-{session}", "x-session-id")
    return Identity(None, "implicit")


def one_call(book: SessionBook, session: int, conversation: Conversation, now_s: float) -> Any:
    """One call of ``session``, as the gateway drives the book: resolve, started, finished."""
    found = resolve(
        book,
        tenant_id="t",
        identity=identity(session),
        model="m",
        conversation=conversation,
        now_s=now_s,
        now_at=NOW,
    )
    book.call_started(found.state, conversation, now_s, found.thread)
    book.call_finished(found.state, conversation, fingerprint(reply(session)), now_s, found.thread)
    book.call_ended(found.state, found.thread)
    return found


def fill(book: SessionBook, sessions: int, count: int) -> None:
    for s in range(sessions):
        one_call(book, s, Conversation.of(messages(s, count)), float(s))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--messages", type=int, default=8, help="messages of each session's call")
    parser.add_argument("--lookups", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=Path("out/session-memory.json"))
    args = parser.parse_args()
    n = args.sessions
    # capacity and per-tenant bound above the fill: nothing is evicted or refused
    book = SessionBook(capacity=n + 1, max_per_tenant=n + 1)
    gc.collect()
    before = rss_bytes()
    started = time.perf_counter()
    fill(book, n, args.messages)
    fill_s = time.perf_counter() - started
    gc.collect()
    after = rss_bytes()

    probe = SessionBook(capacity=n + 1, max_per_tenant=n + 1)
    small = min(n, 20_000)
    tracemalloc.start()
    fill(probe, small, args.messages)
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del probe
    gc.collect()

    rng = random.Random(args.seed)
    resolve_us: dict[str, list[float]] = {"implicit": [], "explicit": []}
    print_us: list[float] = []
    for i, s in enumerate(rng.sample(range(n), min(n, args.lookups))):  # each session once
        nxt = [*messages(s, args.messages), reply(s)]
        nxt.append({"role": "tool", "tool_call_id": "x", "content": f"result {i}"})
        t0 = time.perf_counter()
        conversation = Conversation.of(nxt)
        t1 = time.perf_counter()
        found = one_call(book, s, conversation, float(n + i))
        t2 = time.perf_counter()
        assert found.how == "continued", (s, found.how)
        print_us.append((t1 - t0) * 1e6)
        resolve_us["explicit" if s % 2 == 0 else "implicit"].append((t2 - t1) * 1e6)

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    threads = [t for s in book for t in s.threads.values()]
    doc = {
        "command": "bench/session_memory.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "json"),
        "sessions": n,
        "messages_per_call": args.messages,
        "live_sessions": len(book),
        "fill_s": round(fill_s, 2),
        "rss_before_mib": round(before / 2**20, 1),
        "rss_after_mib": round(after / 2**20, 1),
        "rss_bytes_per_session": round((after - before) / n),
        "traced_bytes_per_session": round(traced / small),
        "index_entries": len(book._index),
        "index_entries_per_session": round(len(book._index) / n, 2),
        "prompt_digests_per_session": statistics.fmean(len(t.prompt) for t in threads),
        "lookup_us": {
            kind: {"median": round(statistics.median(v), 1), "p99": round(pct(v, 0.99), 1)}
            for kind, v in resolve_us.items()
        },
        "fingerprint_us": {
            "median": round(statistics.median(print_us), 1),
            "p99": round(pct(print_us, 0.99), 1),
        },
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
