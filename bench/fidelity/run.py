"""Fidelity validation: calibrate a real engine, run sessions live, replay them, compare.

    bash scripts/vllm-venv.sh
    .venv-vllm/bin/python bench/fidelity/run.py                  # 8 sessions × 10 calls
    .venv-vllm/bin/python bench/fidelity/run.py --sessions 16 --calls 12 --seed 1 --out DIR
    .venv-vllm/bin/python bench/fidelity/run.py --seed 3 --seeds 5 --repeats 3 --write-docs
    .venv-vllm/bin/python bench/fidelity/summarize.py --write-docs DIR/fidelity.json ...

With ``--seeds N`` it runs seeds ``--seed`` … ``--seed + N − 1`` one after another (each in
``OUT/seed-S``), prints every error's median and worst run, and with ``--write-docs`` writes
docs/fidelity.json from them. With ``--repeats R`` each seed's workload runs live R times on
one calibrated runtime (``OUT/repeat-r`` for r ≥ 1), and each live run is predicted by the
others too: how well the machine repeats itself, the floor under the simulator's error.

Every part is real and talks HTTP in its own process:

1. ``talaria runtime`` with two vLLM engines (CPU build, tiny random-weight Llamas, the
   ``talaria`` scheduler at quantum ``--quantum-s``); with ``--pin`` (the default) vLLM's model
   workers get CPU 0 and everything else the other CPUs (``pin_engines``);
2. ``talaria calibrate`` against it → a profile TOML (step-time fit per model);
3. the runtime restarted with that profile, so the live scheduler's service estimates (SP
   admission) are the ones the simulator uses;
4. ``talaria serve --runtime URL`` (SQLite store) and one agent per session driving it with the
   real ``openai`` client: closed loop, sleeping each tool gap between calls;
5. ``talaria trace export`` of the proxy's store → the live trace, with measured timings;
6. the simulator replays that trace (``cpu-vllm`` server, calibrated profile, same flags and
   quantum) and ``talaria.sim.fidelity.compare`` sets prediction against measurement. The same
   replay with the uncalibrated default profile (the roofline with rough CPU figures) is
   reported alongside, to show what calibration buys.

Writes ``OUT/fidelity.json`` (every call and session, predicted and measured) and
``OUT/fidelity.png``; ``summarize.py`` puts several runs into docs/fidelity.json. Measure on a
quiet machine: two cores are shared by vLLM, the runtime, the proxy and the agents.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import string
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import openai

from talaria.core.catalog import load_catalog
from talaria.core.trace import SessionTrace, read_trace
from talaria.runtime.factory import NodeSetup
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import policy_flags
from talaria.sim.fidelity import FidelityWorkload, compare, fidelity_workload, repeatability
from talaria.sim.plots import plot_fidelity
from talaria.sim.replay import Transport, replay

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # bench/harness
import summarize  # bench/fidelity/summarize.py, next to this file

from bench.harness.processes import child_pids, descendant_pids

ROOT = Path(__file__).resolve().parents[2]
TALARIA = Path(sys.executable).parent / "talaria"
MODELS = ("tiny-a", "tiny-b")
STARTED = "Application startup complete"


def log(message: str) -> None:
    print(f"[fidelity {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """A ``talaria`` subprocess whose log goes to a file; ready when uvicorn says so."""

    def __init__(self, name: str, args: list[str], log_path: Path) -> None:
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        self.name = name
        self.proc = subprocess.Popen(
            [str(TALARIA), *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            env=env,
        )  # fmt: skip
        self._ready = threading.Event()
        self._log = log_path.open("w")
        assert self.proc.stderr is not None
        threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True).start()
        if not self._ready.wait(timeout=600) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError(f"{name} did not start; see {log_path}")

    def _drain(self, stream: IO[str]) -> None:
        # Read the log for the process's whole life: a full pipe would block it.
        for line in stream:
            self._log.write(line)
            if STARTED in line:
                self._ready.set()
        self._ready.set()

    def stop(self) -> None:
        """SIGTERM (the proxy flushes its store, the runtime drains), then wait."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.flush()


def node_toml(policy: str, quantum_s: float, profile: str) -> str:
    models = "".join(
        f'\n[[model]]\nname = "{m}"\nengine = "vllm"\npath = "tiny-llama-{m[-1]}"\n'
        "max_model_len = 2048\n"
        for m in MODELS
    )
    return (
        f'[node]\nname = "cpu-node"\npolicy = "{policy}"\nquantum_s = {quantum_s}\n'
        f'server = "cpu-vllm"\nprofile = "{profile}"\n{models}'
    )


def start_runtime(
    out: Path, tag: str, policy: str, quantum_s: float, profile: Path | None, pinned: bool
) -> tuple[Service, str]:
    config = out / f"node-{tag}.toml"
    config.write_text(node_toml(policy, quantum_s, "calibrated" if profile else "default"))
    port = free_port()
    args = ["runtime", "--config", str(config), "--port", str(port)]
    if profile is not None:
        args += ["--catalog", str(profile)]
    log(f"starting the runtime ({tag}) on port {port}: two vLLM CPU engines, ~1 min")
    service = Service(f"runtime-{tag}", args, out / f"runtime-{tag}.log")
    if pinned:
        log(f"pinned {pin_engines(service.proc.pid)} engine threads to CPU 0")
    return service, f"http://127.0.0.1:{port}"


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


def pin_serving_stack(enabled: bool) -> list[int] | None:
    """Keep this process and every child (runtime, proxy, calibrate) off CPU 0, which
    ``pin_engines`` then gives to vLLM's model workers alone: the models compute alone, as on
    a GPU, instead of sharing a core with the HTTP stack and the agents. vLLM's own OpenMP
    binding is turned off (``nobind``) so that it does not undo this."""
    cpus = sorted(os.sched_getaffinity(0))
    if not enabled:
        return None
    if 0 not in cpus and os.environ.get("VLLM_CPU_OMP_THREADS_BIND") == "nobind":
        return cpus  # pinned by an earlier run of this process (--seeds)
    if len(cpus) < 2 or 0 not in cpus:
        return None
    rest = [c for c in cpus if c != 0]
    os.sched_setaffinity(0, rest)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    return rest


def pin_engines(runtime_pid: int) -> int:
    """Every thread of vLLM's model workers onto CPU 0; returns the threads moved.

    Per model, the runtime starts vLLM's EngineCore (scheduling, a child of the runtime), which
    starts the worker process that runs the model (its child). CPU 0 is the device: the workers
    compute there, co-resident engines sharing it as they would share a GPU. The EngineCores
    stay with the serving stack on the other CPUs, as on a GPU node the scheduler runs on host
    cores. (Pinning only the runtime's children had left the model on the serving CPU, where
    the HTTP stack and the agents slowed its steps up to 2×: docs/fidelity.md.)"""
    return sum(pin_threads(descendant_pids(core), {0}) for core in child_pids(runtime_pid))


def pin_threads(pids: list[int], cpus: set[int]) -> int:
    """Every thread of ``pids`` onto ``cpus``; returns the threads moved."""
    moved = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                os.sched_setaffinity(int(task.name), cpus)
                moved += 1
            except OSError:
                pass  # a thread that has just ended
    return moved


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    spec = FidelityWorkload(sessions=args.sessions, calls=args.calls)
    workload = fidelity_workload(spec, args.seed)
    started = time.perf_counter()
    pinned = pin_serving_stack(args.pin)
    log(f"serving stack pinned to CPUs {pinned}" if pinned else "no CPU pinning")

    # 1-2. calibrate a fresh runtime
    profile = out / "profile.toml"
    runtime, url = start_runtime(out, "calibrate", args.policy, args.quantum_s, None, bool(pinned))
    try:
        cmd = [str(TALARIA), "calibrate", "--runtime", url, "--out", str(profile),
               "--name", "calibrated", "--report", str(out / "calibration.json")]  # fmt: skip
        cmd += [a for m in MODELS for a in ("--model", m)]
        if args.quick_calibration:
            cmd.append("--quick")
        log("calibrating: " + " ".join(cmd[1:]))
        subprocess.run(cmd, check=True)
    finally:
        runtime.stop()

    # 3-5. the live run(s) on a runtime that estimates with the calibrated profile, exported
    runtime, url = start_runtime(out, "live", args.policy, args.quantum_s, profile, bool(pinned))
    try:
        lives, live_s = [], []
        for r in range(args.repeats):
            trace, seconds = live_run(url, workload, args.seed, r, repeat_dir(out, r))
            lives.append(trace)
            live_s.append(seconds)
    finally:
        runtime.stop()
    live = lives[0]

    # 6. replay with the calibrated and the default profile, compare
    doc = replay_and_compare(live, profile, args.policy, args.quantum_s)
    if len(lives) > 1:
        doc["repeats"] = repeats_doc(lives, profile, args.policy, args.quantum_s)
    doc["run"] = {
        "sessions": len(live),
        "calls": sum(s.num_calls for s in live),
        "models": list(MODELS),
        "policy": args.policy,
        "quantum_s": args.quantum_s,
        "seed": args.seed,
        "workload": {k: v for k, v in vars(spec).items()},
        "live_wall_s": live_s[0],
        "repeats": args.repeats,
        "total_wall_s": time.perf_counter() - started,
        "quick_calibration": args.quick_calibration,
        "serving_cpus": pinned,
        "calibration": json.loads((out / "calibration.json").read_text()),
    }
    return doc


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


def repeats_doc(
    lives: list[list[SessionTrace]], profile: Path, policy: str, quantum_s: float
) -> dict[str, Any]:
    """Several live runs of one workload: how well they predict each other (``repeatability``,
    the floor under the simulator's error here) and the simulator's figures against each."""
    return {
        "runs": len(lives),
        "live_vs_live": repeatability(lives),
        "predicted_vs_live": [
            replay_and_compare(live, profile, policy, quantum_s)["figures"] for live in lives
        ],
    }


def replay_and_compare(
    live: list[SessionTrace], profile: Path, policy: str, quantum_s: float
) -> dict[str, Any]:
    """The live trace replayed closed-loop with the calibrated profile (the comparison), with
    the default profile (``uncalibrated_figures``), and with the calibrated profile at the
    recorded arrival times (``recorded_arrivals_figures``: the node model alone)."""
    catalog = load_catalog([profile])
    flags = policy_flags(policy)
    config = SchedulerConfig(quantum_s=quantum_s)
    transport = Transport.of(catalog.profile("calibrated"))

    def outcome(name: str, recorded: bool) -> dict[str, Any]:
        layout = [("node0", NodeSetup("cpu-vllm", name, MODELS))]
        result = replay(live, catalog, layout, flags, config, router="talaria",
                        transport=transport, recorded_arrivals=recorded)  # fmt: skip
        return compare(live, result)

    doc = outcome("calibrated", False)
    doc["uncalibrated_figures"] = outcome("default", False)["figures"]
    recorded = outcome("calibrated", True)
    doc["recorded_arrivals_figures"] = recorded["figures"]
    doc["recorded_arrivals_calls"] = recorded["calls"]
    return doc


def replay_only(out: Path, policy: str, quantum_s: float) -> dict[str, Any]:
    """Redo step 6 on a finished run's directory (its live.jsonl and profile.toml), keeping its
    run record: to compare a changed simulator against the same live run."""
    old = json.loads((out / "fidelity.json").read_text())
    profile = out / "profile.toml"
    doc = replay_and_compare(read_trace(out / "live.jsonl"), profile, policy, quantum_s)
    repeats = int(old["run"].get("repeats", 1))
    if repeats > 1:
        lives = [read_trace(repeat_dir(out, r) / "live.jsonl") for r in range(repeats)]
        doc["repeats"] = repeats_doc(lives, profile, policy, quantum_s)
    doc["run"] = old["run"]
    return doc


def report(doc: dict[str, Any]) -> str:
    f, u = doc["figures"], doc["uncalibrated_figures"]
    rows = [
        ("p50 SCT: measured / predicted (s)", f"{f['measured_p50_sct_s']:.2f} / "
         f"{f['predicted_p50_sct_s']:.2f}", f"{u['predicted_p50_sct_s']:.2f}"),
        ("p95 SCT: measured / predicted (s)", f"{f['measured_p95_sct_s']:.2f} / "
         f"{f['predicted_p95_sct_s']:.2f}", f"{u['predicted_p95_sct_s']:.2f}"),
        ("p50 SCT relative error", f"{f['p50_sct_rel_error']:.1%}",
         f"{u['p50_sct_rel_error']:.1%}"),
        ("p95 SCT relative error", f"{f['p95_sct_rel_error']:.1%}",
         f"{u['p95_sct_rel_error']:.1%}"),
        ("per-session SCT |error|: median / p95", f"{f['sct_median_rel_error']:.1%} / "
         f"{f['sct_p95_rel_error']:.1%}", f"{u['sct_median_rel_error']:.1%} / "
         f"{u['sct_p95_rel_error']:.1%}"),
        ("per-call latency |error|: median / p95", f"{f['call_latency_median_rel_error']:.1%} / "
         f"{f['call_latency_p95_rel_error']:.1%}", f"{u['call_latency_median_rel_error']:.1%} / "
         f"{u['call_latency_p95_rel_error']:.1%}"),
        ("per-call latency error, signed median",
         f"{f['call_latency_median_signed_rel_error']:+.1%}",
         f"{u['call_latency_median_signed_rel_error']:+.1%}"),
        ("per-call TTFT |error|: median / p95", f"{f['ttft_median_rel_error']:.1%} / "
         f"{f['ttft_p95_rel_error']:.1%}", f"{u['ttft_median_rel_error']:.1%} / "
         f"{u['ttft_p95_rel_error']:.1%}"),
        ("tool time / SCT (measured)", f"{f['tool_time_fraction']:.1%}", ""),
    ]  # fmt: skip
    r = doc.get("recorded_arrivals_figures")
    if r is not None:
        rows += [
            ("at recorded arrivals: per-call latency |error| median / p95",
             f"{r['call_latency_median_rel_error']:.1%} / {r['call_latency_p95_rel_error']:.1%}",
             ""),
            ("at recorded arrivals: per-call TTFT |error| median / p95",
             f"{r['ttft_median_rel_error']:.1%} / {r['ttft_p95_rel_error']:.1%}", ""),
        ]  # fmt: skip
    width = max(len(r[0]) for r in rows)
    lines = [f"{'':{width}}  {'calibrated':>22}  {'uncalibrated':>22}"]
    lines += [f"{a:{width}}  {b:>22}  {c:>22}" for a, b, c in rows]
    if "repeats" in doc:
        lines += ["", repeats_report(doc["repeats"])]
    return "\n".join(lines)


REPEAT_COLUMNS = (
    ("p50 SCT", "p50_sct_rel_error"),
    ("p95 SCT", "p95_sct_rel_error"),
    ("call latency |err| median", "call_latency_median_rel_error"),
    ("TTFT |err| median", "ttft_median_rel_error"),
)


def repeats_report(repeats: dict[str, Any]) -> str:
    """Per live run: the other runs' median as its prediction, then the simulator's."""
    head = "| live run | predicted by | " + " | ".join(c for c, _ in REPEAT_COLUMNS) + " |"
    lines = [head, "|" + "---|" * (2 + len(REPEAT_COLUMNS))]
    pairs = zip(repeats["live_vs_live"], repeats["predicted_vs_live"], strict=True)
    for r, (peers, sim) in enumerate(pairs):
        for label, f in (("the other runs", peers), ("the simulator", sim)):
            cells = " | ".join(f"{f[k]:.1%}" for _, k in REPEAT_COLUMNS)
            lines.append(f"| {r} | {label} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--calls", type=int, default=10, help="Calls per session.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", default="talaria", help="Scheduler flags (as in replay).")
    parser.add_argument("--quantum-s", type=float, default=2.0)
    parser.add_argument("--quick-calibration", action="store_true",
                        help="talaria calibrate --quick (CI).")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "fidelity")
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="vLLM's model workers on CPU 0, every other process off it (pin_engines; "
        "default: on).",
    )
    parser.add_argument("--seeds", type=int, default=1, help="Run this many seeds from --seed.")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="Live runs of each seed's workload on one calibration (≥ 2: also how well the "
        "runs predict each other, the floor under the simulator's error).",
    )
    parser.add_argument(
        "--replay-only",
        action="store_true",
        help="Redo only the replays and comparison of the finished run(s) in --out.",
    )
    parser.add_argument(
        "--write-docs", action="store_true", help="Write docs/fidelity.json from the runs."
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats takes 1 or more")
    if args.seeds <= 1:
        paths = [_one(args)]
    else:
        base = args.out
        paths = []
        for seed in range(args.seed, args.seed + args.seeds):
            log(f"== seed {seed}")
            paths.append(_one(argparse.Namespace(**{**vars(args), "seed": seed,
                                                    "out": base / f"seed-{seed}"})))  # fmt: skip
    docs = [json.loads(p.read_text()) for p in paths]
    if len(docs) > 1:
        print(summarize.table(docs))
        if args.repeats > 1:
            print(summarize.repeats_table(docs))
    if args.write_docs:
        summarize.write_docs(docs, paths)


def _one(args: argparse.Namespace) -> Path:
    """One seed's run: OUT/fidelity.json and OUT/fidelity.png; returns the JSON's path."""
    doc = replay_only(args.out, args.policy, args.quantum_s) if args.replay_only else run(args)
    (args.out / "fidelity.json").write_text(json.dumps(doc, indent=1) + "\n")
    r = doc["run"]
    title = (
        f"live vLLM-CPU run vs replay: {r['sessions']} sessions, {r['calls']} calls, "
        f"policy {r['policy']}, quantum {r['quantum_s']:g} s"
    )
    plot_fidelity(doc, args.out / "fidelity.png", title)
    print(report(doc))
    log(f"wrote {args.out / 'fidelity.json'} and {args.out / 'fidelity.png'}")
    return args.out / "fidelity.json"


if __name__ == "__main__":
    main()
