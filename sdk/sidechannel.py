"""Hints and ends: small POSTs to Talaria's session endpoints that never fail the agent.

They go through one shared ``httpx.Client`` with a short timeout (2 s by default) from a small
pool of background threads (``talaria-sdk``), for both the sync and the async client: a hint
is *fire-and-forget*, it neither blocks the caller (sync code or an event loop) nor raises.
A session's end waits for that session's pending hints, then for its own request, each wait
bounded by the timeout. Every failure (connection refused, a timeout, a 404 from a server that
is not Talaria or no longer knows the session, a 5xx) is logged on the ``talaria.sdk`` logger
and swallowed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx

log = logging.getLogger("talaria.sdk")

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_WORKERS = 4


class SideChannel:
    """Posts session hints and ends; thread-safe, created lazily, shared by default.

    ``transport`` replaces the network (tests pass an ``httpx.MockTransport``).
    """

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        workers: int = DEFAULT_WORKERS,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self._workers = workers
        self._transport = transport
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._warmed = False

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(timeout=self.timeout_s, transport=self._transport)
            return self._client

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="talaria-sdk")
            return self._pool

    def warm(self) -> None:
        """Build the HTTP client in the background (once), so the first hint leaves fast."""
        with self._lock:
            if self._warmed:
                return
            self._warmed = True
        with contextlib.suppress(RuntimeError):  # the interpreter is shutting down
            self._executor().submit(self._http)

    def post(self, url: str, body: Mapping[str, Any] | None, headers: Mapping[str, str]) -> bool:
        """POST now, in this thread; True on a 2xx. Never raises (failures are logged)."""
        try:
            response = self._http().post(
                url, json=dict(body) if body is not None else None, headers=dict(headers)
            )
        except Exception as exc:  # the agent must never fail because of a hint
            log.warning("talaria: POST %s failed: %s", url, exc)
            return False
        if response.is_success:
            return True
        level = logging.DEBUG if response.status_code == 404 else logging.WARNING
        log.log(level, "talaria: POST %s answered %d", url, response.status_code)
        return False

    def submit(
        self, url: str, body: Mapping[str, Any] | None, headers: Mapping[str, str]
    ) -> Future[bool]:
        """POST from a background thread; the future resolves to :meth:`post`'s answer."""
        try:
            return self._executor().submit(self.post, url, body, headers)
        except RuntimeError as exc:  # the interpreter is shutting down
            log.warning("talaria: POST %s not sent: %s", url, exc)
            done: Future[bool] = Future()
            done.set_result(False)
            return done

    def close(self) -> None:
        """Wait for queued posts, then close the pool and the HTTP client."""
        with self._lock:
            pool, client = self._pool, self._client
            self._pool = self._client = None
        if pool is not None:
            pool.shutdown(wait=True)
        if client is not None:
            client.close()


_default = SideChannel()


def default_channel() -> SideChannel:
    """The channel sessions use unless given one."""
    return _default
