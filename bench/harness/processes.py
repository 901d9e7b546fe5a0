"""Real processes for the benchmarks and the end-to-end tests: ``talaria serve`` and ``talaria
runtime`` as subprocesses (ready when their stderr says where they listen), a throwaway
PostgreSQL server (scripts/pg.sh) that a test may stop and start again, and process trees."""

from __future__ import annotations

import os
import queue
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
STARTUP_S = 60.0
LISTENING = re.compile(r"Uvicorn running on (http://\S+)")
_CLI = "import sys; from talaria.cli import main; sys.argv[0] = 'talaria'; main()"


def talaria_command() -> list[str]:
    """The ``talaria`` executable of this venv (or the CLI through this interpreter)."""
    talaria = Path(sys.executable).with_name("talaria")
    return [str(talaria)] if talaria.exists() else [sys.executable, "-c", _CLI]


def tenant_key(url: str, tenant: str, *options: str) -> str:
    """A new API key of ``tenant`` in the database at ``url`` (``talaria keys create``, with
    ``options`` such as ``--priority interactive``; no TALARIA_* setting of this process
    reaches it): the ``tk-`` key it prints."""
    command = [*talaria_command(), "keys", "create", "--tenant", tenant, "--url", url, *options]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALARIA_")}
    done = subprocess.run(
        command, capture_output=True, text=True, check=True, env={**env, "COLUMNS": "400"}
    )
    match = re.search(r"tk-[A-Za-z0-9_-]+", done.stdout)
    if match is None:
        raise RuntimeError(f"talaria keys create printed no key: {done.stdout!r}")
    return match.group(0)


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux ``/proc``)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def descendant_pids(pid: int) -> list[int]:
    """Every process below ``pid``: its children, theirs, and so on (parents first)."""
    out = []
    for child in child_pids(pid):
        out += [child, *descendant_pids(child)]
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it; another may take it later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def stopped(process: subprocess.Popen[Any], grace_s: float) -> None:
    """Stop ``process`` if it still runs: SIGTERM, and SIGKILL if it has not exited within
    ``grace_s``; reaped either way."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass
class ServeProcess:
    """A running ``talaria serve``; ``output`` collects its stderr lines."""

    process: subprocess.Popen[str]
    base_url: str
    output: list[str] = field(default_factory=list)

    @property
    def v1(self) -> str:
        """The OpenAI-style base URL (``BASE_URL/v1``)."""
        return self.base_url + "/v1"

    def sigterm(self) -> None:
        """Ask it to drain and stop (SIGTERM)."""
        self.process.send_signal(signal.SIGTERM)

    def kill9(self) -> None:
        """Kill it at once (SIGKILL) and reap it."""
        self.process.kill()
        self.process.wait(timeout=30)

    def wait(self, timeout_s: float) -> int:
        """Its exit status, waiting at most ``timeout_s``."""
        return self.process.wait(timeout=timeout_s)


def _pump(stream: Any, lines: queue.Queue[str | None], keep: list[str]) -> None:
    for line in stream:
        keep.append(line)
        lines.put(line)
    lines.put(None)


@contextmanager
def talaria_serve(
    args: list[str],
    env: dict[str, str],
    data_dir: Path,
    port: int = 0,
    max_descriptors: int | None = None,
    startup_s: float = STARTUP_S,
) -> Iterator[ServeProcess]:
    """Start ``talaria serve --port PORT ARGS`` (0: any free port) with ``env`` on top of this
    process's environment (minus any TALARIA_* setting) and its data dir in ``data_dir``; wait
    until it listens (``startup_s`` at most between two lines of its output); on exit terminate
    it (and kill it if it does not stop within 60 s). ``max_descriptors``: its
    ``RLIMIT_NOFILE`` (soft and hard). With ``--model`` its runtime child writes to the same
    stream: only the proxy's own listening line, after its "talaria proxy on" line, counts
    (``--upstream`` likewise)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TALARIA_")}
    full_env = {**base, "TALARIA_DATA_DIR": str(data_dir), **env}
    command = [*talaria_command(), "serve", "--port", str(port), *args]
    after = "talaria proxy on" if "--model" in args or "--upstream" in args else None
    with _listening(command, full_env, max_descriptors, after, startup_s) as served:
        yield served


@contextmanager
def talaria_runtime(
    config: Path,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    startup_s: float = STARTUP_S,
    stdout: int | None = subprocess.DEVNULL,
) -> Iterator[ServeProcess]:
    """Start ``talaria runtime --config CONFIG --port 0 ARGS`` with ``env`` on top of this
    process's environment (minus any TALARIA_* setting: e.g. ``TALARIA_RUNTIME_TOKEN`` only if
    ``env`` sets it); wait until it listens (``startup_s`` at most between two lines of its
    output: a vLLM engine's start can be silent for longer than the default). The port is the
    one the OS picks as uvicorn binds: one picked free beforehand can be taken by another
    process during the engines' start, and uvicorn binds only after its startup. ``stdout``:
    where its standard output goes (vLLM logs there; None: this process's)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TALARIA_")}
    command = [*talaria_command(), "runtime", "--config", str(config), "--port", "0", *args]
    full_env = {**base, **(env or {})}
    with _listening(command, full_env, startup_s=startup_s, stdout=stdout) as served:
        yield served


@contextmanager
def _listening(
    command: list[str],
    full_env: dict[str, str],
    max_descriptors: int | None = None,
    after: str | None = None,
    startup_s: float = STARTUP_S,
    stdout: int | None = subprocess.DEVNULL,
) -> Iterator[ServeProcess]:
    def limit_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max_descriptors, max_descriptors))

    process = subprocess.Popen(
        command,
        env=full_env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=None if max_descriptors is None else limit_descriptors,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    seen: list[str] = []
    threading.Thread(target=_pump, args=(process.stderr, lines, seen), daemon=True).start()
    base_url = None
    try:
        counting = after is None
        while base_url is None:
            line = lines.get(timeout=startup_s)  # bounded: queue.Empty fails the test
            if line is None:
                raise RuntimeError(f"{command[1:3]} exited:\n" + "".join(seen))
            counting = counting or after in line
            match = LISTENING.search(line)
            if counting and match and any("Application startup complete" in s for s in seen):
                base_url = match.group(1)
        yield ServeProcess(process, base_url, seen)
    finally:
        stopped(process, 60)


@dataclass
class Postgres:
    """A PostgreSQL server of its own (scripts/pg.sh), to stop and start during a test."""

    directory: Path
    port: int
    url: str = ""

    def start(self) -> str:
        """Start the server (its data directory kept between starts); its URL."""
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "pg.sh"), "start", str(self.directory), str(self.port)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        self.url = done.stdout.strip().splitlines()[-1]
        return self.url

    def stop(self) -> None:
        """Stop the server (fast shutdown)."""
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "pg.sh"), "stop", str(self.directory)],
            capture_output=True,
            timeout=120,
            check=True,
        )
