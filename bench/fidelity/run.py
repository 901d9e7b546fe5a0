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

The parts, next to this file: serving.py (the processes and the CPU pinning), live.py (the
live runs), compare.py (the replays, the comparison and its table).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from talaria.sim.fidelity import FidelityWorkload, fidelity_workload
from talaria.sim.plots import plot_fidelity

sys.path.insert(0, str(Path(__file__).resolve().parent))
import summarize  # bench/fidelity/summarize.py, next to this file
from compare import repeats_doc, replay_and_compare, replay_only, report
from live import live_run, repeat_dir
from serving import MODELS, ROOT, TALARIA, log, pin_serving_stack, start_runtime


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
    return Path(args.out) / "fidelity.json"


if __name__ == "__main__":
    main()
