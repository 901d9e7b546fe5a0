"""Hold policies: whether a session that finished a call keeps a hold for its next one
(admission budget and its KV: holds.py ``KvHolds``), and how long its KV is held
(policies/__init__.py lists the kinds).

- ``NoHolds``: nothing is held; a session's KV is idle, evictable, once its call ends.
- ``MeanGapHolds``: the session holds for its next call, expected after its tool-gap hint
  or its mean observed gap (core/holds.py's rule decides whether, and how long the slot
  stays open for it); the hint is used once.
- ``LearnedGapHolds``: as the mean rule, but a session without a hint holds its KV at least
  to the q-quantile of its learned log-normal gap (core/gaps.py: per population (tenant,
  model, agent) an online fit of ln(gap), per session μ_s = (3 μ_pop + Σ ln g) / (3 + n));
  the node's sessions observe their gaps into ``population``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from talaria.core.gaps import PopulationGaps
from talaria.runtime.scheduling.events import SessionEvents
from talaria.runtime.scheduling.sessions import NodeSession, NodeSessions

HoldNext = Callable[[float, float | None], None]
"""``hold_next(expected_gap_s, hold_s)``: the session holds for its next call, expected in
``expected_gap_s``, its KV held ``hold_s`` (None: the mean rule's slack)."""


class HoldPolicy(SessionEvents):
    """What a session keeps between its calls; ``after_call`` is required."""

    name: ClassVar[str]
    population: PopulationGaps | None = None
    """The node's gap fits by population, when the policy learns them (the node's sessions
    observe into it)."""

    def __init__(self, gap_quantile: float) -> None:
        self.gap_quantile = gap_quantile

    def after_call(self, session: NodeSession, sessions: NodeSessions, hold_next: HoldNext) -> None:
        """The session finished a call (not its last): hold for its next one, or not."""
        raise NotImplementedError


class NoHolds(HoldPolicy):
    """Nothing is held between calls."""

    name = "none"

    def after_call(self, session: NodeSession, sessions: NodeSessions, hold_next: HoldNext) -> None:
        return None


class MeanGapHolds(HoldPolicy):
    """Hold for the next call, expected after the hint or the mean gap."""

    name = "mean-gap"

    def after_call(self, session: NodeSession, sessions: NodeSessions, hold_next: HoldNext) -> None:
        gap = session.expected_gap_s()
        session.hint_gap_s = None
        hold_next(gap, None)


class LearnedGapHolds(MeanGapHolds):
    """The mean rule; without a hint, the KV held to the learned gap's q-quantile."""

    name = "learned-gap"

    def __init__(self, gap_quantile: float) -> None:
        super().__init__(gap_quantile)
        self.population = PopulationGaps()

    def after_call(self, session: NodeSession, sessions: NodeSessions, hold_next: HoldNext) -> None:
        if session.hint_gap_s is not None:
            super().after_call(session, sessions, hold_next)
            return
        learned = sessions.predicted_gap(session, self.gap_quantile)
        hold_next(session.expected_gap_s(), learned.hold_s)
