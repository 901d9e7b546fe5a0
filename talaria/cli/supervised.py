"""The runtime ``talaria serve --model`` starts for its models: ``talaria runtime --model ...``
as a child process on a free loopback port, waited for until ready, watched while the proxy
serves, and stopped with it.

- **Token.** The child gets a runtime token in its environment (``TALARIA_RUNTIME_TOKEN``:
  the operator's, else a random one ``talaria serve`` draws), so that other users of the
  machine, who can reach its loopback port too, cannot call it; the proxy sends it.
- **Start.** The child runs this same interpreter (the environment that has vLLM) in a
  session of its own, so that the vLLM processes it starts (engine core, workers) form one
  process group with it; its output goes to the proxy's terminal. Ready when its
  ``/readyz`` answers 200 (every engine started); a child that exits first fails the start
  with its exit status.
- **Watch.** A child that exits while the proxy serves stops the proxy (SIGTERM to this
  process): a proxy whose only runtime is gone would answer every call 503.
- **Stop.** SIGTERM, then up to its drain time plus ``ENGINE_STOP_S`` for it to exit; past
  that, or if anything of its group is left once it exited, SIGKILL to the whole group, so no
  vLLM process outlives ``talaria serve``. A proxy stopped by a signal does not get there
  (uvicorn raises the signal again once it has drained, and the default action ends the
  process), and one killed outright cannot: so the child also asks the kernel for SIGTERM
  when its parent dies (Linux's ``PR_SET_PDEATHSIG``), and then drains and stops its engines
  by itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence

import httpx

from talaria.core.protocol import RUNTIME_TOKEN_ENV

ENGINE_STOP_S = 30.0
"""What the runtime's own shutdown allows its engines past the drain (runtime/serve.py)."""
READY_POLL_S = 0.5


PR_SET_PDEATHSIG = 1
"""prctl(2): the signal this process gets when its parent dies."""


def _term_with_parent() -> None:
    """In the child, before it runs: SIGTERM when the parent dies (a no-op off Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class RuntimeStartError(RuntimeError):
    """The child runtime exited, or was not ready in time."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class SupervisedRuntime:
    """One ``talaria runtime`` child (see the module docstring)."""

    def __init__(
        self,
        args: Sequence[str],
        drain_timeout_s: float,
        port: int | None = None,
        token: str | None = None,
    ):
        """``token``: the child's ``TALARIA_RUNTIME_TOKEN`` (None: what this process has)."""
        self.port = port or free_port()
        self._env = {**os.environ, RUNTIME_TOKEN_ENV: token} if token else None
        self.url = f"http://127.0.0.1:{self.port}"
        self._drain_s = drain_timeout_s
        command = [sys.executable, "-c", "from talaria.cli import main; main()", "runtime"]
        self._command = [
            *command,
            *args,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--drain-timeout-s",
            str(drain_timeout_s),
        ]
        self._process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()

    def start(self, ready_timeout_s: float) -> None:
        """Start the child and wait until it is ready (``RuntimeStartError`` otherwise)."""
        self._process = subprocess.Popen(
            self._command, start_new_session=True, preexec_fn=_term_with_parent, env=self._env
        )
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            code = self._process.poll()
            if code is not None:
                raise RuntimeStartError(f"the runtime exited with status {code} while starting")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(READY_POLL_S)
        self.stop()
        raise RuntimeStartError(f"the runtime was not ready within {ready_timeout_s:g} s")

    def watch(self) -> None:
        """From now on, the child's exit (other than by :meth:`stop`) stops this process."""
        process = self._process
        if process is None:
            return

        def wait() -> None:
            code = process.wait()
            if not self._stopping.is_set():
                print(f"talaria: the runtime exited (status {code}); stopping", file=sys.stderr)
                os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=wait, name="runtime-watch", daemon=True).start()

    def stop(self) -> None:
        """SIGTERM the child, wait for it (drain + ``ENGINE_STOP_S``), then SIGKILL what is
        left of its process group."""
        self._stopping.set()
        process = self._process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=self._drain_s + ENGINE_STOP_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def supervised_runtime(
    args: Sequence[str], drain_timeout_s: float, ready_timeout_s: float, token: str | None = None
) -> Iterator[SupervisedRuntime]:
    """A started, watched child runtime (with ``token`` as its runtime token), stopped on
    exit."""
    runtime = SupervisedRuntime(args, drain_timeout_s, token=token)
    try:
        runtime.start(ready_timeout_s)
        runtime.watch()
        yield runtime
    finally:
        runtime.stop()
