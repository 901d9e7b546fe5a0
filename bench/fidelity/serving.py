"""The serving stack of bench/fidelity/run.py, each part a ``talaria`` process of its own: the
runtime with two vLLM CPU engines (``start_runtime``), the proxy (``Service``), and the CPU
pinning that gives vLLM's model workers CPU 0 and everything else the other CPUs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/harness
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
