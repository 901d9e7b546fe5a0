"""Throttling of failed sign-ins (the console's form, and a wrong admin bearer token).

The rule: an address (the connection's peer) that failed ``max_failures`` (5) sign-ins within
the last ``window_s`` (60 s) is refused — its right token too — with 429 and ``Retry-After``
until the oldest of those failures is ``window_s`` old. A success forgets the address's
failures. The table holds at most ``max_addresses`` (10,000) addresses; past that, the one
least recently seen is dropped (an attacker with more addresses than that still gets only
five guesses a minute from each). The peer address is what is counted: behind a reverse
proxy every client shares its address.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable

MAX_FAILURES = 5
WINDOW_S = 60.0
MAX_ADDRESSES = 10_000


class SignInThrottle:
    """Failed sign-ins per address, and who must wait (the module docstring's rule); times
    are seconds of ``clock``, monotonic by default."""

    def __init__(
        self,
        *,
        max_failures: int = MAX_FAILURES,
        window_s: float = WINDOW_S,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_failures = max_failures
        self._window_s = window_s
        self._max_addresses = max_addresses
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after_s(self, address: str) -> int | None:
        """Whole seconds until ``address`` may try again, or None if it may now."""
        times = self._recent(address)
        if times is None or len(times) < self._max_failures:
            return None
        return max(1, math.ceil(times[0] + self._window_s - self._clock()))

    def failed(self, address: str) -> None:
        """Count one failed sign-in of ``address`` now."""
        times = self._recent(address)
        if times is None:
            if len(self._failures) >= self._max_addresses:
                self._failures.popitem(last=False)
            times = self._failures[address] = deque(maxlen=self._max_failures)
        times.append(self._clock())

    def succeeded(self, address: str) -> None:
        """``address`` signed in: forget its failures."""
        self._failures.pop(address, None)

    def _recent(self, address: str) -> deque[float] | None:
        """The address's failures within the window (older ones dropped), marked as seen."""
        times = self._failures.get(address)
        if times is None:
            return None
        self._failures.move_to_end(address)
        cutoff = self._clock() - self._window_s
        while times and times[0] <= cutoff:
            times.popleft()
        return times
