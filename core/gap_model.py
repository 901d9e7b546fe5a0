"""One gap model (issue 47): what the proxy and the node learn of a session's tool gaps, and
how well it predicts them.

Pure: no clock, no I/O; every gap is an argument in seconds (the time from a call's finish to
the session's next call). A ``GapModel`` is fed each observed gap (``observe``) and answers
the gap it expects (``expected_s``) and how long to hold for it to cover a share q of gaps
(``hold_s(q)``). Two implement it:

- ``MeanGaps`` (the mean rule; the proxy's route preferences and the node's holds):
  expected = (prior_s × prior_weight + Σ g) / (prior_weight + n), the prior 3.2 s (the tool-gap
  mean of docs/sources.md §2) with weight 1; hold = the slack rule max(2 × expected,
  expected + 1 s), whatever q (the mean rule fits no spread: its hold is what the node's
  mean-gap hold has always been, core/holds.py ``plan_hold``).
- ``LogNormalGaps`` (the ``learned_gaps`` flag; core/gaps.py): the session's own ln(gap)s
  blended with its population's online log-normal, μ_s = (3 μ_pop + Σ ln g) / (3 + n), σ the
  population's; expected = the median e^μ_s; hold = max(min(e^(μ_s + z_q σ), 600 s),
  e^μ_s + 1 s). Observing a gap feeds the session and its population.

**How well it predicts** (``GapQuality``, fed with each observed gap and the prediction made
before it, ``expected`` and ``hold``): n; the median of |ln g − ln expected| (gaps and
expectations floored at 1 ms, core/gaps.py ``log_gap``; kept as a count per 0.001, so the
median is exact to 0.001 and the memory bounded however many gaps it sees); the coverage, the
share of gaps g ≤ hold (for a calibrated model at q, about q). ``GapFigures`` is what it
reports (the node's status and the replay document, per model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from talaria.core.gaps import (
    DEFAULT_QUANTILE,
    DEFAULT_SESSION_WEIGHT,
    GapPrediction,
    PopulationGaps,
    PopulationKey,
    SessionGaps,
    log_gap,
    predict_session,
)

DEFAULT_GAP_PRIOR_S = 3.2
"""docs/sources.md §2: the fitted tool-gap mixture has mean ≈ 3.2 s."""
SLACK_FACTOR = 2.0
MIN_SLACK_S = 1.0
MEAN = "mean"
LOG_NORMAL = "log-normal"
ERROR_STEP = 1e-3
"""The resolution of ``GapQuality``'s median absolute log error."""


def slack_hold_s(
    expected_gap_s: float, slack_factor: float = SLACK_FACTOR, min_slack_s: float = MIN_SLACK_S
) -> float:
    """The slack rule: max(slack_factor × gap, gap + min_slack_s), seconds."""
    return max(slack_factor * expected_gap_s, expected_gap_s + min_slack_s)


class GapModel(Protocol):
    """A session's learned tool gap (module docstring)."""

    @property
    def name(self) -> str:
        """The model's name (``MEAN``, ``LOG_NORMAL``)."""
        ...

    def observe(self, gap_s: float) -> None:
        """Add one observed gap, seconds."""
        ...

    def expected_s(self) -> float:
        """The gap it expects next, seconds."""
        ...

    def hold_s(self, quantile: float) -> float:
        """How long to hold for the next call so as to cover a share ``quantile`` of gaps."""
        ...


@dataclass
class MeanGaps:
    """The mean rule: (prior_s × prior_weight + Σ observed) / (prior_weight + n); its hold the
    slack rule, whatever the quantile."""

    prior_s: float = DEFAULT_GAP_PRIOR_S
    prior_weight: float = 1.0
    total_s: float = 0.0
    count: int = 0

    @property
    def name(self) -> str:
        """``MEAN``."""
        return MEAN

    def observe(self, gap_s: float) -> None:
        """Add one observed gap, seconds (a negative one counts as 0)."""
        self.total_s += max(0.0, gap_s)
        self.count += 1

    def expected_s(self) -> float:
        """The expected gap, seconds: the prior blended with the observed mean (formula above)."""
        return (self.prior_s * self.prior_weight + self.total_s) / (self.prior_weight + self.count)

    def hold_s(self, quantile: float = DEFAULT_QUANTILE) -> float:
        """The slack rule of the expected gap (``quantile`` plays no part)."""
        return slack_hold_s(self.expected_s())


@dataclass
class LogNormalGaps:
    """A session's log-normal gap: its own ln(gap)s (``own``) blended with the fit of its
    population ``key`` in ``population`` (core/gaps.py ``predict_session``)."""

    population: PopulationGaps
    key: PopulationKey
    """The population it learns under (the node sets it from each call: tenant, model, agent)."""
    own: SessionGaps = field(default_factory=SessionGaps)
    session_weight: float = DEFAULT_SESSION_WEIGHT

    @property
    def name(self) -> str:
        """``LOG_NORMAL``."""
        return LOG_NORMAL

    def observe(self, gap_s: float) -> None:
        """Add one gap to the session's own and to its population's fit."""
        self.own.observe(gap_s)
        self.population.observe(self.key, gap_s)

    def prediction(
        self, quantile: float = DEFAULT_QUANTILE, *, touch: bool = False
    ) -> GapPrediction:
        """Its median and hold to ``quantile``; ``touch``: mark its population's fit used (the
        node does when it holds by it), else only read it."""
        fit = self.population.fit(self.key) if touch else self.population.peek(self.key)
        return predict_session(self.own, fit, session_weight=self.session_weight, quantile=quantile)

    def expected_s(self) -> float:
        """The median gap e^μ_s, seconds."""
        return self.prediction().median_s

    def hold_s(self, quantile: float = DEFAULT_QUANTILE) -> float:
        """max(min(e^(μ_s + z_q σ), 600 s), e^μ_s + 1 s), seconds."""
        return self.prediction(quantile).hold_s


@dataclass(frozen=True)
class GapFigures:
    """How well a gap model predicted (``GapQuality.figures``): ``n`` gaps; the median of
    |ln gap − ln expected| (None before any gap); ``coverage``, the share of gaps within the
    hold to ``quantile`` (None before any gap)."""

    n: int = 0
    median_abs_log_error: float | None = None
    coverage: float | None = None
    quantile: float = DEFAULT_QUANTILE


@dataclass
class GapQuality:
    """The accumulator of a gap model's predictions against the gaps that followed them
    (module docstring). Merge several (a fleet's nodes) with ``merge``."""

    quantile: float = DEFAULT_QUANTILE
    n: int = 0
    covered: int = 0
    errors: dict[int, int] = field(default_factory=dict)
    """|ln g − ln expected| in ``ERROR_STEP``s → how many gaps had it."""

    def observe(self, gap_s: float, expected_s: float, hold_s: float) -> None:
        """One gap, and what was predicted before it: the expected gap and the hold."""
        step = round(abs(log_gap(gap_s) - log_gap(expected_s)) / ERROR_STEP)
        self.errors[step] = self.errors.get(step, 0) + 1
        self.n += 1
        self.covered += gap_s <= hold_s

    def judge(self, model: GapModel, gap_s: float) -> None:
        """``observe`` ``gap_s`` against ``model``'s prediction now (call it before the model
        observes the gap)."""
        self.observe(gap_s, model.expected_s(), model.hold_s(self.quantile))

    def merge(self, other: GapQuality) -> None:
        """Add ``other``'s gaps (of the same quantile) to these."""
        if other.quantile != self.quantile:
            raise ValueError(f"quantiles differ: {self.quantile} and {other.quantile}")
        self.n += other.n
        self.covered += other.covered
        for step, count in other.errors.items():
            self.errors[step] = self.errors.get(step, 0) + count

    def median_abs_log_error(self) -> float | None:
        """The median |ln g − ln expected| (the mean of the two middle ones for an even n)."""
        if not self.n:
            return None
        middle = ((self.n - 1) // 2, self.n // 2)
        found: list[int] = []
        seen = 0
        for step in sorted(self.errors):
            seen += self.errors[step]
            while len(found) < 2 and middle[len(found)] < seen:
                found.append(step)
            if len(found) == 2:
                break
        return round((found[0] + found[1]) / 2 * ERROR_STEP, 4)

    def coverage(self) -> float | None:
        """The share of gaps within their hold."""
        return self.covered / self.n if self.n else None

    def figures(self) -> GapFigures:
        """What it reports."""
        return GapFigures(self.n, self.median_abs_log_error(), self.coverage(), self.quantile)
