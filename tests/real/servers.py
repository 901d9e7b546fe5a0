"""What the real-model stage's modules share: the clients of a ``talaria serve`` in front of a
real model and its admin API, the check that an answer is the model's, and a server of their
own (``vllm serve``, ``llama-server``) started on a free port with its output in a file."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import httpx
import openai
import pytest

from bench.harness.processes import ServeProcess, stopped
from tests.support import admin_get

ADMIN = "real-admin-token"
NAME = "smollm2"
"""The served name of the stage's ``talaria serve --model NAME=PATH`` (tests/real/conftest.py)."""
CANNED = "[simulated]"
"""The simulator's replies' first word (runtime/engines/sim_reply.py): never the model's."""


def real_text(text: str | None) -> str:
    """``text``, checked to be the model's: not empty, not the simulator's canned reply."""
    assert text and text.strip() and CANNED not in text, text
    return text


def openai_client(
    served: ServeProcess, session: str | None = None, timeout_s: float = 120.0
) -> openai.OpenAI:
    """The ``openai`` client of ``served`` (no retries), naming ``session`` if given."""
    headers = {"X-Talaria-Session-Id": session} if session else None
    return openai.OpenAI(
        base_url=served.v1, api_key="none", default_headers=headers, max_retries=0,
        timeout=timeout_s,
    )  # fmt: skip


def anthropic_client(served: ServeProcess) -> anthropic.Anthropic:
    """The ``anthropic`` client of ``served`` (no retries)."""
    return anthropic.Anthropic(base_url=served.base_url, api_key="none", max_retries=0)


def admin(served: ServeProcess, path: str) -> Any:
    """GET ``path`` of ``served``'s admin API (its token ``ADMIN``), as JSON."""
    return admin_get(served.base_url, ADMIN, path)


def statuses(served: ServeProcess, session: str) -> list[str]:
    """The statuses of ``session``'s calls, in order; none while the session is not recorded
    yet (the proxy writes its records behind the calls: the admin API answers 404 until the
    first one lands — a fresh-clone CI run once asked before it had)."""
    reply = httpx.get(
        f"{served.base_url}/admin/sessions/{session}",
        headers={"authorization": f"Bearer {ADMIN}"},
        timeout=30,
    )
    if reply.status_code == 404:
        return []
    assert reply.status_code == 200, reply.text
    return [c["status"] for c in reply.json()["calls"]]


class Fronts:
    """A stack whose ``talaria serve`` is ``served``: its clients and admin API."""

    served: ServeProcess

    def client(self, session: str | None = None) -> openai.OpenAI:
        return openai_client(self.served, session)

    def claude(self) -> anthropic.Anthropic:
        return anthropic_client(self.served)

    def admin(self, path: str) -> Any:
        return admin(self.served, path)

    def statuses(self, session: str) -> list[str]:
        return statuses(self.served, session)


@dataclass
class LoggedServer:
    """A server process of a test's own (None: one given by URL), its root URL and its output
    so far (a file)."""

    process: subprocess.Popen[bytes] | None
    root: str
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


S = TypeVar("S", bound=LoggedServer)


@contextmanager
def logged_server(
    kind: type[S],
    name: str,
    command: list[str],
    root: str,
    log: Path,
    ready: Callable[[S], bool],
    startup_s: float,
    every_s: float = 0.2,
    env: dict[str, str] | None = None,
) -> Iterator[S]:
    """Start ``command`` (``env``: its whole environment, or this process's) with its output in
    ``log``; ask ``ready(server)`` every ``every_s`` (a starting process: no event to wait on)
    until it is true, failing the test if the process exits or ``startup_s`` pass; terminate
    it at the end (killed if it takes over 30 s)."""
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    server = kind(process, root, log)
    try:
        deadline = time.monotonic() + startup_s
        while not ready(server):
            if process.poll() is not None:
                pytest.fail(f"{name} exited ({process.returncode}):\n{server.tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{name} did not answer within {startup_s:.0f} s:\n{server.tail()}")
            threading.Event().wait(every_s)
        yield server
    finally:
        stopped(process, 30)
