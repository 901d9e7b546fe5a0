"""A model's demand over a trailing window, as the placement controller reads it (pure: the
caller passes the time, so the simulator's virtual clock and a live proxy's clock both fit).

- ``d_m`` (:meth:`DemandMeter.demand`): the distinct sessions that sent model ``m`` a call
  that arrived within the last ``window_s``;
- ``c_m`` (:meth:`DemandMeter.call_s`): the mean duration (admitted to finished) of ``m``'s
  calls that finished within it;
- its idleness (:meth:`DemandMeter.idle_s`, :meth:`DemandMeter.gap_p99_s`): how long since
  ``m``'s last call, and the 99th percentile of the times between its calls (what its
  keep-alive is learned from, core/placement/keep_alive.py).

Both may be read over a shorter window than the meter keeps (``window_s`` of the read); the
meter forgets what fell out of its own window as calls come and as it is read, so its memory
is bounded by the calls of one window.
"""

from __future__ import annotations

from collections import deque

from talaria.core.placement.keep_alive import gap_quantile


class DemandMeter:
    """Calls as they arrive and finish (module docstring); times in one clock's seconds."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._arrivals: deque[tuple[float, str, str]] = deque()
        self._finished: deque[tuple[float, str, float]] = deque()

    def arrived(self, now_s: float, model: str, session: str) -> None:
        """A call of ``session`` to ``model`` arrived at ``now_s`` (times never go back)."""
        self._arrivals.append((now_s, model, session))
        self._forget(now_s)

    def finished(self, now_s: float, model: str, seconds: float) -> None:
        """A call to ``model`` that ran ``seconds`` finished at ``now_s``."""
        self._finished.append((now_s, model, seconds))
        self._forget(now_s)

    def _forget(self, now_s: float) -> None:
        horizon = now_s - self.window_s
        while self._arrivals and self._arrivals[0][0] < horizon:
            self._arrivals.popleft()
        while self._finished and self._finished[0][0] < horizon:
            self._finished.popleft()

    def demand(self, now_s: float, window_s: float | None = None) -> dict[str, float]:
        """``d_m``: distinct sessions with a call in the last ``window_s`` (the meter's window
        if None or longer)."""
        self._forget(now_s)
        horizon = now_s - min(window_s or self.window_s, self.window_s)
        sessions: dict[str, set[str]] = {}
        for at_s, model, session in self._arrivals:
            if at_s >= horizon:
                sessions.setdefault(model, set()).add(session)
        return {m: float(len(s)) for m, s in sessions.items()}

    def call_s(self, now_s: float, window_s: float | None = None) -> dict[str, float]:
        """``c_m``: mean duration of the calls that finished in the last ``window_s``."""
        return {m: total / n for m, (n, total) in self._calls(now_s, window_s).items()}

    def idle_s(self, now_s: float) -> dict[str, float]:
        """Seconds since each model's last call, for the models with a call in the window."""
        self._forget(now_s)
        last: dict[str, float] = {}
        for at_s, model, _ in self._arrivals:
            last[model] = at_s
        return {m: now_s - at_s for m, at_s in last.items()}

    def gap_p99_s(self, now_s: float, window_s: float | None = None) -> dict[str, float]:
        """The 99th percentile of the times between consecutive calls of each model in the
        last ``window_s``, for the models with two calls or more there."""
        self._forget(now_s)
        horizon = now_s - min(window_s or self.window_s, self.window_s)
        previous: dict[str, float] = {}
        gaps: dict[str, list[float]] = {}
        for at_s, model, _ in self._arrivals:
            if at_s < horizon:
                continue
            if model in previous:
                gaps.setdefault(model, []).append(at_s - previous[model])
            previous[model] = at_s
        quantiles = {m: gap_quantile(g) for m, g in gaps.items()}
        return {m: q for m, q in quantiles.items() if q is not None}

    def finished_calls(self, now_s: float, window_s: float | None = None) -> dict[str, int]:
        """How many calls of each model finished in the last ``window_s`` (the weights that
        merge several meters' ``c_m``)."""
        return {m: n for m, (n, _) in self._calls(now_s, window_s).items()}

    def _calls(self, now_s: float, window_s: float | None) -> dict[str, tuple[int, float]]:
        self._forget(now_s)
        horizon = now_s - min(window_s or self.window_s, self.window_s)
        sums: dict[str, tuple[int, float]] = {}
        for at_s, model, seconds in self._finished:
            if at_s >= horizon:
                n, total = sums.get(model, (0, 0.0))
                sums[model] = (n + 1, total + seconds)
        return sums
