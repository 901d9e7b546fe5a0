"""A watchdog for a server's event loop, from a thread of its own: it notices when the loop is
blocked, says where, makes ``/healthz`` fail, and ends the process when a shutdown overruns.

- **Stalls.** The loop bumps a heartbeat every ``interval_s``; the watchdog thread reads it
  every ``interval_s``. The loop's lag is ``now − last beat − interval_s``. A lag over
  ``stall_s`` is a stall: logged once, as a warning with the stack the loop's thread is running
  (the code that blocks it), and remembered: :meth:`LoopWatchdog.health` is not ok while a
  stall lasts and for ``remember_s`` after it ends, so a liveness probe that timed out during
  the stall and asks again afterwards still learns of it.
- **Shutdown deadline.** :meth:`ExitDeadline.arm` (called from the SIGTERM handler) starts a
  timer thread: if the process is still alive ``seconds`` later — its loop blocked, or a
  drain that never ends — it logs the loop thread's stack and ends the process with
  ``os._exit(EXIT_CODE)``. Python runs a signal handler between bytecodes of the main thread,
  so this holds for a loop spinning in Python code; a loop stuck inside one long C call runs the
  handler only when the call returns.

Wall time is right here (unlike in policy code): the watchdog measures the real loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import traceback
from typing import Any

log = logging.getLogger("talaria.watchdog")

DEFAULT_STALL_S = 5.0
DEFAULT_REMEMBER_S = 60.0
DEFAULT_INTERVAL_S = 0.25
EXIT_CODE = 70
"""EX_SOFTWARE (sysexits.h): the process did not stop by itself."""


class LoopWatchdog:
    """Watches one event loop from a thread for stalls (see the module docstring); times are
    wall seconds (``time.monotonic``)."""

    def __init__(
        self,
        stall_s: float = DEFAULT_STALL_S,
        remember_s: float = DEFAULT_REMEMBER_S,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self.stall_s = stall_s
        self.remember_s = remember_s
        self.interval_s = interval_s
        self._beat = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._stop = threading.Event()
        self._stalled_since: float | None = None
        self._worst_lag_s = 0.0
        self._last_stall: tuple[float, float] | None = None
        """(when it ended, monotonic; how long the loop was blocked, s)."""

    def start(self) -> None:
        """Start watching the running loop (call from inside it)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._loop.call_later(self.interval_s, self._tick)
        threading.Thread(target=self._watch, name="loop-watchdog", daemon=True).start()

    def stop(self) -> None:
        """Stop the heartbeat and the watchdog thread (within one ``interval_s``)."""
        self._stop.set()

    def _tick(self) -> None:
        self._beat = time.monotonic()
        if not self._stop.is_set() and self._loop is not None:
            self._loop.call_later(self.interval_s, self._tick)

    def lag_s(self) -> float:
        """How late the loop's heartbeat is now (0 when it runs freely)."""
        return max(0.0, time.monotonic() - self._beat - self.interval_s)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.observe(self.lag_s(), time.monotonic())

    def observe(self, lag_s: float, now: float) -> None:
        """Fold one lag reading in (the watchdog thread calls it; tests may too)."""
        if lag_s > self.stall_s:
            if self._stalled_since is None:
                self._stalled_since = now - lag_s
                log.warning(
                    "the event loop has been blocked for %.1f s; it is running:\n%s",
                    lag_s,
                    self.loop_stack(),
                )
            self._worst_lag_s = max(self._worst_lag_s, lag_s)
        elif self._stalled_since is not None:
            log.warning("the event loop ran again after %.1f s blocked", self._worst_lag_s)
            self._last_stall = (now, self._worst_lag_s)
            self._stalled_since, self._worst_lag_s = None, 0.0

    def health(self, now: float | None = None) -> dict[str, Any]:
        """``{"ok": True, "lag_s": ...}``, or ``{"ok": False, "blocked_s": ..., "ago_s": ...}``
        during a stall and for ``remember_s`` after it: ``blocked_s`` is the stall's length so
        far (or its whole length once it ended), ``ago_s`` how long ago it ended (0 while it
        lasts); seconds."""
        now = time.monotonic() if now is None else now
        if self._stalled_since is not None:
            return {"ok": False, "blocked_s": round(now - self._stalled_since, 3), "ago_s": 0.0}
        if self._last_stall is not None and now - self._last_stall[0] < self.remember_s:
            ended, blocked = self._last_stall
            return {"ok": False, "blocked_s": round(blocked, 3), "ago_s": round(now - ended, 3)}
        return {"ok": True, "lag_s": round(self.lag_s(), 3)}

    def loop_stack(self) -> str:
        """The stack the watched loop's thread is running now (what blocks it in a stall)."""
        return thread_stack(self._loop_thread)


def thread_stack(ident: int | None) -> str:
    """The stack of thread ``ident`` (the main thread when None), innermost call last."""
    frame = sys._current_frames().get(ident or threading.main_thread().ident or 0)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(unknown)"


class ExitDeadline:
    """Ends the process if it outlives a shutdown deadline (see the module docstring)."""

    def __init__(self) -> None:
        self._timer: threading.Timer | None = None

    def arm(self, seconds: float) -> None:
        """End the process if it is still alive ``seconds`` from now (the first deadline holds).
        Safe from a signal handler of the main thread, where the event loop runs."""
        if self._timer is not None:
            return
        self._timer = threading.Timer(seconds, _exit, args=(seconds, threading.get_ident()))
        self._timer.daemon = True
        self._timer.start()


def _exit(seconds: float, loop_thread: int) -> None:
    log.error(
        "still running %.1f s after the shutdown signal: exiting now (code %d); the loop is "
        "running:\n%s",
        seconds,
        EXIT_CODE,
        thread_stack(loop_thread),
    )
    logging.shutdown()
    os._exit(EXIT_CODE)
