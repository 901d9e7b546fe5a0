"""Sampling profile of a bench server with py-spy (``bench/proxy_overhead.py --py-spy PATH``).

py-spy attaches to the running server (``--nonblocking``: it never pauses it) and records
non-idle stacks of every thread, aggregated by function, in collapsed ("raw") form. Here they are
summed into milliseconds per request: ``samples / rate / requests``, per thread (``thread``),
per function including what it calls (``inclusive``) and per innermost Python function
(``self``, which includes the C code it runs, e.g. SQLite or JSON).
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
THREAD = re.compile(r"^thread \(\d+\): (?P<name>.*)$")


class PySpy:
    def __init__(self, executable: str, pid: int, output: Path, rate: int = 250) -> None:
        self.output, self.rate = output, rate
        self._proc = subprocess.Popen(
            [
                executable,
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(rate),
                "--nonblocking",
                "--threads",
                "--function",
                "--format",
                "raw",
                "--output",
                str(output),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
        _, err = self._proc.communicate(timeout=60)
        if not self.output.exists():
            raise RuntimeError(f"py-spy wrote nothing: {err.decode(errors='replace')[-500:]}")


def _short(frame: str) -> str:
    match = FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    path = match["file"]
    for marker in ("site-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        parts = Path(path).parts
        path = "/".join(parts[-2:]) if len(parts) > 1 else path
    return f"{match['func']} ({path})"


CATEGORIES = (
    "other threads (the SQLite writer and checkpointer; py-spy counts their GIL and I/O "
    "waits, /proc does not)",
    "persistence on the event loop (BatchWriter, store calls)",
    "talaria code (handler, sessions, gateway, runtime events, SSE rendering)",
    "response send (Starlette response → uvicorn → h11 → socket)",
    "Starlette/FastAPI (middleware, routing, request objects)",
    "uvicorn + h11 (reading and parsing requests)",
    "event loop, selector, other",
)


def _category(main_thread: bool, frames: list[str]) -> str:
    """The first category (in ``CATEGORIES`` order) that a sampled stack belongs to."""
    files = []
    for frame in frames:
        match = FRAME.match(frame.strip())
        files.append(f"{match['file']}:{match['func']}" if match else frame)

    def has(*needles: str) -> bool:
        return any(n in f for f in files for n in needles)

    if not main_thread:
        return CATEGORIES[0]
    if has("/proxy/store/", "sqlalchemy/", "aiosqlite/"):
        return CATEGORIES[1]
    if any("talaria/" in f and "talaria/proxy/edge/app.py:" not in f for f in files):
        return CATEGORIES[2]
    if has("starlette/responses.py:", "RequestResponseCycle.send", "send_with_id"):
        return CATEGORIES[3]
    if has("starlette/", "fastapi/"):
        return CATEGORIES[4]
    if has("uvicorn/", "h11/"):
        return CATEGORIES[5]
    return CATEGORIES[6]


def summarize_profile(path: Path, rate: int, requests: int, top: int = 25) -> dict[str, Any]:
    """Milliseconds of sampled (non-idle) time per request: by thread, inclusive, self."""
    threads: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    categories: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = THREAD.match(frames[0])
        name = "?"
        if thread is not None:
            name = re.sub(r"[-_ ]?\(?\d+\)?.*$", "", thread["name"]) or thread["name"]
            frames = frames[1:]
        short = [_short(f) for f in frames]
        threads[name] += count
        categories[_category(name == "MainThread", frames)] += count
        for func in set(short):
            inclusive[func] += count
        if short:
            own[short[-1]] += count
        total += count
    scale = 1e3 / rate / max(1, requests)

    def table(counter: Counter[str]) -> list[dict[str, Any]]:
        return [
            {"function": f, "ms_per_request": round(n * scale, 4), "share": round(n / total, 4)}
            for f, n in counter.most_common(top)
        ]

    return {
        "rate_hz": rate,
        "requests": requests,
        "samples": total,
        "ms_per_request": round(total * scale, 4),
        "threads": {t: round(n * scale, 4) for t, n in threads.most_common()},
        "categories": {c: round(categories[c] * scale, 4) for c in CATEGORIES},
        "inclusive": table(inclusive),
        "self": table(own),
    }
