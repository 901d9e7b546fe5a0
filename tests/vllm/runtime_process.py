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

from bench.harness.processes import LISTENING


@contextmanager
def running_runtime(
    config: Path, start_timeout_s: float = 600, args: tuple[str, ...] = ()
) -> Iterator[str]:
    """Start the runtime on ``config`` (and ``args``) on a port the OS picks as it binds
    (``--port 0``); yield its URL once it listens; SIGTERM it at the end. (A port picked free
    beforehand can be taken by another process during the engines' start, tens of seconds,
    and uvicorn binds only after its startup: the runtime then exits.)"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    talaria = Path(sys.executable).parent / "talaria"
    proc = subprocess.Popen(
        [str(talaria), "runtime", "--config", str(config), "--port", "0", *args],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stderr is not None
    seen: list[str] = []
    urls: list[str] = []
    started = threading.Event()

    def drain(stream: IO[str]) -> None:
        # Keep reading the runtime's log for its whole life: vLLM logs a lot, and a full pipe
        # would block the process. Uvicorn's line with the bound address tells it serves.
        for line in stream:
            seen.append(line)
            if (match := LISTENING.search(line)) and not urls:
                urls.append(match.group(1))
                started.set()
        started.set()  # the process ended (the assertion below reports it)

    threading.Thread(target=drain, args=(proc.stderr,), daemon=True).start()
    started.wait(timeout=start_timeout_s)  # engines start one at a time (~20 s each)
    if proc.poll() is not None or not urls:
        proc.kill()
        raise RuntimeError("runtime did not start:\n" + "".join(seen[-40:]))
    try:
        yield urls[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
