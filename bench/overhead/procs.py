"""The processes of ``bench/proxy_overhead.py``: each server started on loopback, waited for and
stopped; its CPU time and the machine's, read from /proc; its garbage-collection pauses, read
from its log; the machine it ran on."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import platform
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SERVERS = Path(__file__).resolve().parent / "servers.py"
HOST = "127.0.0.1"
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    info: dict[str, Any] = field(default_factory=dict)
    idle_cpu_per_s: float = 0.0
    measured_from: int = 0
    """Where its log stood when the measurement began (after start-up and warm-up)."""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def proc_tree_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` and its live descendants (all threads), in seconds."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        rest = raw[raw.rfind(b")") + 2 :].split()
        stats[int(entry)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) * TICK_S)
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, _) in stats.items():
            if ppid == parent and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(stats[p][1] for p in tree if p in stats)


def main_thread_cpu_s(pid: int) -> float:
    """utime + stime of the main thread of ``pid`` (its event loop), in seconds."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return 0.0
    rest = raw[raw.rfind(b")") + 2 :].split()
    return (int(rest[11]) + int(rest[12])) * TICK_S


def system_busy_s() -> float:
    """CPU seconds all processors spent busy since boot (/proc/stat: all but idle, iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) * TICK_S


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TALARIA_", "LITELLM_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_server(
    name: str, cmd: list[str], port: int, workdir: Path, env: dict[str, str] | None = None
) -> Server:
    log = workdir / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=env or clean_env(),
            start_new_session=True,
        )
    return Server(name, port, proc, log)


def wait_ready(server: Server, path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    url = f"http://{HOST}:{server.port}{path}"
    while time.monotonic() < deadline:
        if not server.alive():
            raise RuntimeError(
                f"{server.name} exited with {server.proc.returncode}:\n{server.log_tail()}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status < 500:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{server.name} not ready after {timeout_s:.0f} s:\n{server.log_tail()}")


def stop_server(server: Server) -> None:
    if not server.alive():
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.proc.pid, signal.SIGTERM)
    try:
        server.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)


def gc_pauses(log: Path, start: int) -> dict[str, dict[str, float]]:
    """Collections over 1 ms a server logged (``--gc-log``) from byte ``start`` of its log on
    (the measurement): per generation, how many and the longest."""
    out: dict[str, dict[str, float]] = {}
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "gc" and parts[3] == "ms":
            figures = out.setdefault(parts[1], {"count": 0, "max_ms": 0.0})
            figures["count"] += 1
            figures["max_ms"] = max(figures["max_ms"], float(parts[2]))
    return out


def machine() -> dict[str, Any]:
    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as f:
        mem_gib = round(int(f.readline().split()[1]) / 2**20, 1)
    versions = {}
    for dist in ("fastapi", "starlette", "uvicorn", "sqlalchemy", "aiosqlite", "pydantic"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": versions,
        "loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        "http": "httptools" if importlib.util.find_spec("httptools") else "h11",
    }
