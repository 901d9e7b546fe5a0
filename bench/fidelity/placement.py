"""Where vLLM's CPU engines should run: one engine's step times with the serving CPU idle and
busy, and the co-resident stretch, for each way of placing the engine processes
(docs/fidelity.md, "Where the engines run").

    .venv-vllm/bin/python bench/fidelity/placement.py [--rounds 4] [--json out/placement.json]

Per engine the runtime starts vLLM's EngineCore (scheduling), and that starts the worker process
that runs the model. The serving stack (this process, the runtime, the proxy, the agents) runs
on the CPUs other than 0. Placements:

- ``workers`` (bench/fidelity/run.py's: serving.py ``pin_engines``): the workers on CPU 0, the
  EngineCores with the stack;
- ``engines``: EngineCores and workers on CPU 0;
- ``cores``: only the EngineCores on CPU 0, the workers left with the stack (what run.py did
  before it pinned the workers).

Each round measures, for tiny-a: a decode step of 4 sequences at context 512 (the slope of
tokens over time) and a 300-token prefill step (the engine's own timestamps), once with the
serving CPU idle and once while a busy loop holds it; then the decode step alone and beside 4
sequences of tiny-b (``Calibrator.coresident``). It prints the medians over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import ROOT, pin_serving_stack, pin_threads, start_runtime  # next to this file

from bench.harness.processes import child_pids, descendant_pids
from talaria.calibrate_live import Calibrator
from talaria.proxy.runtimes.http import HttpRuntime
from talaria.sim.calibrate import CalibrationPlan

PLACEMENTS = ("workers", "engines", "cores")
BUSY_LOOP = ["python3", "-c", "while True: pass"]


def place(runtime_pid: int, placement: str) -> None:
    """Pin the runtime's engine processes to CPU 0 as ``placement`` says (module docstring)."""
    for core in child_pids(runtime_pid):
        pids = {"workers": descendant_pids(core), "engines": [core, *descendant_pids(core)]}
        pin_threads(pids.get(placement, [core]), {0})


async def measure(url: str, rounds: int, serving_cpu: int) -> dict[str, float]:
    runtime = HttpRuntime(url)
    await runtime.start()
    cal = Calibrator(runtime, CalibrationPlan(decode_tokens=48), tag="placement")
    try:
        for model in ("tiny-a", "tiny-b"):
            await cal.warm_up(model)
        got: dict[str, list[float]] = {}
        for _ in range(rounds):
            for host in ("idle", "busy"):
                loop = None
                if host == "busy":
                    loop = subprocess.Popen(["taskset", "-c", str(serving_cpu), *BUSY_LOOP])
                try:
                    decode = await cal.decode("tiny-a", 4, 512)
                    trace = await cal._call(
                        cal._request("tiny-a", cal._session("tiny-a"), 0, 300, 1, False)
                    )
                finally:
                    if loop is not None:
                        loop.kill()
                        loop.wait()
                times = trace.result.engine
                assert times is not None, "the engine reports no timestamps of its own"
                got.setdefault(f"decode_{host}_ms", []).append(decode.seconds * 1e3)
                step = (times.first_token_s - times.scheduled_s) * 1e3
                got.setdefault(f"prefill_{host}_ms", []).append(step)
            point = await cal.coresident("tiny-a", "tiny-b", 4, 512, 4)
            got.setdefault("coresident_ratio", []).append(float(point["ratio"]))
    finally:
        await runtime.close()
    return {k: statistics.median(v) for k, v in got.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--placements", default=",".join(PLACEMENTS))
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "placement")
    parser.add_argument("--json", type=Path, help="Also write the medians here.")
    args = parser.parse_args()
    serving = pin_serving_stack(True)
    if not serving:
        raise SystemExit("needs two CPUs or more, CPU 0 among them")
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for placement in args.placements.split(","):
        service, url = start_runtime(args.out, placement, "talaria", 2.0, None, False)
        try:
            place(service.proc.pid, placement)
            results[placement] = asyncio.run(measure(url, args.rounds, serving[0]))
        finally:
            service.stop()
    print(
        "| placement | decode step, serving CPU idle / busy (ms) "
        "| prefill step, idle / busy (ms) | co-resident decode ratio |"
    )
    print("|---|---|---|---|")
    for placement, r in results.items():
        print(
            f"| {placement} | {r['decode_idle_ms']:.1f} / {r['decode_busy_ms']:.1f} "
            f"| {r['prefill_idle_ms']:.1f} / {r['prefill_busy_ms']:.1f} "
            f"| {r['coresident_ratio']:.2f} |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
