"""The event-loop watchdog (core/loop_watchdog.py): stalls make /healthz fail during them and
for a while after; a process whose loop is blocked still ends after SIGTERM, within its drain
timeout plus the stated grace, through the proxy's and the runtime's own servers."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from bench.harness.processes import free_port
from talaria.core.loop_watchdog import EXIT_CODE, LoopWatchdog
from talaria.proxy.edge.serve import EXIT_GRACE_S
from tests.support import REPO_ROOT


@pytest.mark.parametrize(
    ("readings", "at", "ok", "blocked_s"),
    [
        ([(0.1, 10.0)], 10.0, True, None),  # a small lag is no stall
        ([(6.0, 10.0)], 10.0, False, 6.0),  # blocked now, for 6 s
        ([(6.0, 10.0), (0.0, 11.0)], 11.0, False, 6.0),  # it ended: remembered
        ([(6.0, 10.0), (8.0, 12.0), (0.0, 13.0)], 13.0, False, 8.0),  # the worst reading
        ([(6.0, 10.0), (0.0, 11.0)], 71.5, True, None),  # forgotten 60 s after it ended
    ],
)
def test_stalls_and_how_long_they_are_remembered(
    readings: list[tuple[float, float]], at: float, ok: bool, blocked_s: float | None
) -> None:
    watchdog = LoopWatchdog(stall_s=5.0, remember_s=60.0)
    for lag, now in readings:
        watchdog.observe(lag, now)
    health = watchdog.health(now=at)
    assert health["ok"] is ok
    if blocked_s is not None:
        assert health["blocked_s"] == pytest.approx(blocked_s)


def test_a_blocked_loop_is_seen_and_logged_with_its_stack(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> dict[str, object]:
        watchdog = LoopWatchdog(stall_s=0.2, remember_s=60.0, interval_s=0.05)
        watchdog.start()
        await asyncio.sleep(0.1)
        assert watchdog.health()["ok"]

        def block_the_loop() -> None:
            time.sleep(1.0)  # the stimulus: a handler that blocks the loop

        block_the_loop()
        deadline = time.monotonic() + 10
        while watchdog.health()["ok"] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        health = watchdog.health()
        watchdog.stop()
        return health

    health = asyncio.run(run())
    assert health["ok"] is False and float(str(health["blocked_s"])) >= 0.2
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "blocked" in logged and "block_the_loop" in logged


SPIN_PROXY = """
import sys
from fastapi import FastAPI
from talaria.core.http_edge import EdgeBounds
from talaria.proxy.edge.serve import serve

app = FastAPI()

@app.get("/block")
async def block():
    print("blocking the loop", file=sys.stderr, flush=True)
    while True:
        pass

serve(app, "127.0.0.1", {port}, "info", drain_timeout_s=1.0, bounds=EdgeBounds())
"""

SPIN_RUNTIME = """
import sys
from fastapi import FastAPI
import talaria.runtime.serve as serve

serve.ENGINE_SHUTDOWN_S = 1.0
app = FastAPI()

@app.get("/block")
async def block():
    print("blocking the loop", file=sys.stderr, flush=True)
    while True:
        pass

serve.serve_runtime(app, "127.0.0.1", {port}, "info", drain_timeout_s=1.0)
"""


@pytest.mark.parametrize(
    ("script", "deadline_s"), [(SPIN_PROXY, 1.0 + EXIT_GRACE_S), (SPIN_RUNTIME, 2.0)]
)
def test_sigterm_ends_a_process_whose_loop_is_blocked(script: str, deadline_s: float) -> None:
    port = free_port()
    code = textwrap.dedent(script).format(port=port)
    process = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True
    )
    assert process.stderr is not None
    try:
        for line in process.stderr:  # its own startup line, not a timer
            if "Uvicorn running" in line:
                break
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(f"http://127.0.0.1:{port}/block", timeout=1.0)
        for line in process.stderr:
            if "blocking the loop" in line:
                break
        signaled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=deadline_s + 20) == EXIT_CODE
        took = time.monotonic() - signaled
        log = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert deadline_s <= took < deadline_s + 20
    assert "exiting now" in log and "in block" in log  # the stack of the blocked loop
