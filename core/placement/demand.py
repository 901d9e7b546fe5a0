"""A model's demand over a trailing window, as the placement controller reads it (pure: the
caller passes the time, so the simulator's virtual clock and a live proxy's clock both fit).

- ``d_m`` (:meth:`DemandMeter.demand`): the distinct sessions that sent model ``m`` a call
  that arrived within the last ``window_s``;
- ``c_m`` (:meth:`DemandMeter.call_s`): the mean duration (admitted to finished) of ``m``'s
  calls that finished within it.

Both forget what fell out of the window as they are read: memory is bounded by the calls of
one window.
"""

from __future__ import annotations

from collections import deque


class DemandMeter:
    """Calls as they arrive and finish (module docstring); times in one clock's seconds."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._arrivals: deque[tuple[float, str, str]] = deque()
        self._finished: deque[tuple[float, str, float]] = deque()

    def arrived(self, now_s: float, model: str, session: str) -> None:
        """A call of ``session`` to ``model`` arrived at ``now_s`` (times never go back)."""
        self._arrivals.append((now_s, model, session))

    def finished(self, now_s: float, model: str, seconds: float) -> None:
        """A call to ``model`` that ran ``seconds`` finished at ``now_s``."""
        self._finished.append((now_s, model, seconds))

    def demand(self, now_s: float) -> dict[str, float]:
        """``d_m``: distinct sessions with a call in the last ``window_s``."""
        horizon = now_s - self.window_s
        while self._arrivals and self._arrivals[0][0] < horizon:
            self._arrivals.popleft()
        sessions: dict[str, set[str]] = {}
        for _, model, session in self._arrivals:
            sessions.setdefault(model, set()).add(session)
        return {m: float(len(s)) for m, s in sessions.items()}

    def call_s(self, now_s: float) -> dict[str, float]:
        """``c_m``: mean duration of the calls that finished in the last ``window_s``."""
        horizon = now_s - self.window_s
        while self._finished and self._finished[0][0] < horizon:
            self._finished.popleft()
        sums: dict[str, list[float]] = {}
        for _, model, seconds in self._finished:
            sums.setdefault(model, []).append(seconds)
        return {m: sum(v) / len(v) for m, v in sums.items()}
