"""Throttling of failed sign-ins (the console's form, and a wrong admin bearer token), such
that guessing stays slow and nobody can lock the operator out.

Each address (the connection's peer) keeps its failed sign-ins over the last ``window_s``
(60 s), in two parts: those whose first ``PREFIX_CHARS`` (4) characters are the admin token's,
and the others.

- Past ``max_failures`` (5) failures in all, a wrong token gets 429 with ``Retry-After``
  (until fewer are in the window) instead of 401;
- past ``max_failures`` failures with the token's prefix, the right token gets 429 too.

So the right token still signs in from an address that a guesser floods with wrong tokens —
behind an ingress, every client shares one address — unless the guesser knows the token's
first four characters. Guessing stays as slow as before: a guess with another prefix is wrong
whatever its answer, and at most ``max_failures`` guesses a minute with the right prefix are
ever checked; the right token itself passes only while fewer than that failed with its
prefix. For a random 16-character token (the shortest accepted, proxy/contract/settings.py) over 62
symbols, a guesser who sprays prefixes hits the right one once in 62⁴ ≈ 1.5 · 10⁷ guesses,
so holding the operator out takes ~7 · 10⁷ guesses a minute; and each checked guess is right
with probability 62⁻¹². A success forgets the address's failures with the token's prefix
(the operator's own typos), not the others. The prefix is compared in
constant time, as the token is (``hmac.compare_digest``).

The table holds at most ``max_addresses`` (10,000) addresses; past that, the one least
recently seen is dropped.
"""

from __future__ import annotations

import hmac
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_FAILURES = 5
WINDOW_S = 60.0
MAX_ADDRESSES = 10_000
PREFIX_CHARS = 4


@dataclass(frozen=True)
class SignIn:
    """The verdict on one sign-in: ``ok``, else refused, with ``retry_after_s`` when
    throttled (429) and None when only wrong (401)."""

    ok: bool
    retry_after_s: int | None = None


@dataclass
class _Failures:
    """One address's failures in the window, oldest first: with the token's prefix, and the
    others (each kept to ``max_failures``: no more can matter)."""

    with_prefix: deque[float] = field(default_factory=deque)
    other: deque[float] = field(default_factory=deque)


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
        self._failures: OrderedDict[str, _Failures] = OrderedDict()

    def attempt(self, address: str, given: str, token: str) -> SignIn:
        """Check ``given`` against ``token`` for ``address`` and count it if wrong (module
        docstring)."""
        failures = self._recent(address)
        if hmac.compare_digest(given.encode(), token.encode()):
            wait_s = self._wait_s(list(failures.with_prefix))
            if wait_s is not None:
                return SignIn(False, wait_s)
            failures.with_prefix.clear()  # the operator's typos
            return SignIn(True)
        wait_s = self._wait_s(sorted([*failures.with_prefix, *failures.other]))
        same_prefix = len(given) >= PREFIX_CHARS and hmac.compare_digest(
            given[:PREFIX_CHARS].encode(), token[:PREFIX_CHARS].encode()
        )
        times = failures.with_prefix if same_prefix else failures.other
        times.append(self._clock())
        if len(times) > self._max_failures:
            times.popleft()
        return SignIn(False, wait_s)

    def _wait_s(self, times: list[float]) -> int | None:
        """Whole seconds until fewer than ``max_failures`` of ``times`` (sorted) are in the
        window, or None if that is so now: the (n − max + 1)-th oldest must leave it."""
        excess = len(times) - self._max_failures
        if excess < 0:
            return None
        return max(1, math.ceil(times[excess] + self._window_s - self._clock()))

    def _recent(self, address: str) -> _Failures:
        """The address's failures within the window (older ones dropped), marked as seen."""
        failures = self._failures.get(address)
        if failures is None:
            if len(self._failures) >= self._max_addresses:
                self._failures.popitem(last=False)
            failures = self._failures[address] = _Failures()
        self._failures.move_to_end(address)
        cutoff = self._clock() - self._window_s
        for times in (failures.with_prefix, failures.other):
            while times and times[0] <= cutoff:
                times.popleft()
        return failures
