"""Time for policy and scheduler code.

Scheduler code never reads ``time.time()`` and never sleeps on wall time: it asks a ``Clock``.
All clocks read the running asyncio loop's ``time()``, so one implementation serves three uses:

- real: a normal event loop, ``scale=1``;
- scaled: a normal loop, ``now() = loop.time() × scale`` and ``sleep(dt)`` waits ``dt / scale``
  wall seconds (fast demos of the simulated engine);
- virtual: ``VirtualTimeLoop``, whose time jumps to the next timer whenever nothing is ready, so
  the same coroutines replay hours of traffic in seconds (the simulator).
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, overload

T = TypeVar("T")


class Clock(Protocol):
    """What scheduler and policy code reads time from (clock seconds; see the module doc)."""

    def now(self) -> float:
        """The current clock time, seconds (an arbitrary origin: only differences count)."""
        ...

    async def sleep(self, dt_s: float) -> None:
        """Wait ``dt_s`` clock seconds (a negative ``dt_s`` waits none)."""
        ...

    async def wait_event(self, event: asyncio.Event, timeout_s: float | None) -> bool:
        """Wait until ``event`` is set (True) or ``timeout_s`` clock seconds pass (False)."""
        ...


class LoopClock:
    """Reads the running loop's time, multiplied by ``scale`` (1 = real or virtual time)."""

    def __init__(self, scale: float = 1.0) -> None:
        if scale <= 0:
            raise ValueError("clock scale must be positive")
        self.scale = scale

    def now(self) -> float:
        """Clock seconds: loop.time() × scale."""
        return asyncio.get_running_loop().time() * self.scale

    async def sleep(self, dt_s: float) -> None:
        """Wait ``dt_s`` clock seconds: max(0, dt_s) / scale loop seconds."""
        await asyncio.sleep(max(0.0, dt_s) / self.scale)

    async def wait_event(self, event: asyncio.Event, timeout_s: float | None) -> bool:
        """Wait until ``event`` is set (True) or ``timeout_s`` clock seconds pass (False);
        None waits without a limit."""
        if event.is_set():
            return True
        if timeout_s is None:
            await event.wait()
            return True
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
        # that arrives just after the event is set, so a cancelled waiter would never stop.
        try:
            async with asyncio.timeout(max(0.0, timeout_s) / self.scale):
                await event.wait()
        except TimeoutError:
            return False
        return True

    def loop_delay(self, dt_s: float) -> float:
        """Loop seconds that correspond to ``dt_s`` clock seconds (for ``call_later``)."""
        return max(0.0, dt_s) / self.scale


@dataclass(frozen=True)
class TimeScale:
    """Converts durations between wall seconds and clock seconds, the one place that does:
    ``clock_s = wall_s × scale`` (``scale`` is a scaled ``LoopClock``'s; 1 for real or virtual
    time). The proxy schedules in clock seconds and shows wall seconds (records, metrics,
    ``/v1/models``); clients' hints come in wall seconds."""

    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.scale <= 0:
            raise ValueError("time scale must be positive")

    def wall(self, clock_s: float) -> float:
        """Wall seconds of a duration in clock seconds: ``clock_s / scale``."""
        return clock_s / self.scale

    @overload
    def clock(self, wall_s: float) -> float: ...
    @overload
    def clock(self, wall_s: None) -> None: ...
    def clock(self, wall_s: float | None) -> float | None:
        """Clock seconds of a duration given in wall seconds: ``wall_s × scale`` (None: None)."""
        return None if wall_s is None else wall_s * self.scale


class _VirtualSelector(selectors.DefaultSelector):
    """Polls real file descriptors without blocking, then advances virtual time by the timeout
    the loop would have slept. While work handed to a thread (``run_in_executor``,
    ``asyncio.to_thread``) is pending, it waits for that work in real time first: a thread's
    work takes no virtual time."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if ready or timeout == 0:
            return ready
        if self._loop.thread_jobs:
            return super().select(None)  # the job's completion wakes the loop's self-pipe
        if timeout is None:
            raise VirtualTimeDeadlock(
                "virtual loop has nothing ready and no timer pending: every task is waiting "
                "on something that can never happen"
            )
        if timeout > 0:
            self._loop.advance(timeout)
        return []


class VirtualTimeDeadlock(RuntimeError):
    """Raised when a virtual-time run can make no further progress."""


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock starts at 0 and jumps to the next scheduled timer when idle."""

    def __init__(self) -> None:
        self._virtual_now_s = 0.0
        self.thread_jobs = 0
        """Work handed to a thread and not yet finished."""
        super().__init__(selector=_VirtualSelector(self))
        self._clock_resolution = 1e-9

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Any, *args: Any
    ) -> asyncio.Future[Any]:
        """As the base loop's, counting the job in ``thread_jobs`` until it finishes (the
        selector waits for it in real time instead of advancing virtual time)."""
        future = super().run_in_executor(executor, func, *args)
        self.thread_jobs += 1

        def done(_: asyncio.Future[Any]) -> None:
            self.thread_jobs -= 1

        future.add_done_callback(done)
        return future

    def time(self) -> float:
        """Virtual seconds since the loop was made (starts at 0)."""
        return self._virtual_now_s

    def advance(self, dt_s: float) -> None:
        """Move virtual time forward by ``dt_s`` seconds (the selector does, when idle)."""
        self._virtual_now_s += dt_s


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a fresh ``VirtualTimeLoop`` and close it; tasks still
    pending then (``main`` failed) are cancelled first, as ``asyncio.run`` does."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        finally:
            loop.close()
