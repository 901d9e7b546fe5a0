"""``talaria runtime`` as a real process on a free loopback port, for the vLLM tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from bench.harness.processes import free_port


@contextmanager
def running_runtime(
    config: Path, start_timeout_s: float = 600, args: tuple[str, ...] = ()
) -> Iterator[str]:
    """Start the runtime on ``config`` (and ``args``); yield its URL once it serves; SIGTERM it
    at the end."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    talaria = Path(sys.executable).parent / "talaria"
    proc = subprocess.Popen(
        [str(talaria), "runtime", "--config", str(config), "--port", str(port), *args],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stderr is not None
    seen: list[str] = []
    started = threading.Event()

    def drain(stream: IO[str]) -> None:
        # Keep reading the runtime's log for its whole life: vLLM logs a lot, and a full pipe
        # would block the process. The startup line tells when it is serving.
        for line in stream:
            seen.append(line)
            if "Application startup complete" in line:
                started.set()
        started.set()  # the process ended (the assertion below reports it)

    threading.Thread(target=drain, args=(proc.stderr,), daemon=True).start()
    started.wait(timeout=start_timeout_s)  # engines start one at a time (~20 s each)
    if proc.poll() is not None or not any("Application startup complete" in s for s in seen):
        proc.kill()
        raise RuntimeError("runtime did not start:\n" + "".join(seen[-40:]))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
