"""Tool gaps learned on the server: an online log-normal per population, blended per session
(the ``learned_gaps`` scheduler flag; issue 41, item 3).

Pure: no clock, no I/O; every gap is an argument in seconds. The node's scheduler keeps one
``PopulationGaps`` and, per session, a ``core.gap_model.LogNormalGaps`` (a ``SessionGaps`` and its
population's key: runtime/scheduling/sessions.py), fed as the mean rule's ``MeanGaps``: a gap is
the time from a call's finish to the session's next call arriving at the node.

**Prior.** docs/sources.md §2 fits the tool gap as a mixture, 96 % lognormal(median 0.4 s,
σ 1.3) + 4 % lognormal(median 35 s, σ 1.0). With weights w_i, log-medians μ_i = ln(median_i)
and log-s.d.s σ_i, the mixture's ln(gap) has

- mean μ0 = Σ w_i μ_i = 0.96 · ln 0.4 + 0.04 · ln 35 = 0.96 · (−0.9163) + 0.04 · 3.5553
  = −0.7374 (median e^μ0 ≈ 0.478 s);
- variance σ0² = Σ w_i (σ_i² + μ_i²) − μ0² = 0.96 · (1.69 + 0.8396) + 0.04 · (1 + 12.6405)
  − 0.5438 = 2.4302, so σ0 = 1.5589.

The log-normal with these moments (``PRIOR_LOG_MEAN``, ``PRIOR_LOG_SD``) is the prior: median
0.478 s, 0.9-quantile e^(μ0 + 1.2816 σ0) ≈ 3.53 s (the mixture's own 0.9-quantile is ≈ 3.0 s;
a single log-normal cannot be bimodal, and its fitted tail is the compromise).

**Population** (``LogNormalFit``, one per key): Welford's running mean and sum of squared
deviations of ln(gap), seeded as ``prior_weight`` = k observations (default 20; est.) at mean μ0
with variance σ0²: n = k, mean = μ0, M2 = k σ0². Each gap g: n ← n + 1, d = ln g − mean,
mean ← mean + d / n, M2 ← M2 + d (ln g − mean); σ = √(M2 / n). The key at the node is
(tenant, model, agent): ``CallRequest.tenant`` is a digest of the tenant, ``model`` the model,
``agent`` the agent's kind as the proxy found it (its ``User-Agent``'s product name, e.g.
``claude-cli``, else where its session id came from: proxy/sessions/identity.py; "" in a
replayed trace). Bounded memory: ``PopulationGaps`` keeps at most ``max_keys`` (default 1,024)
fits, least recently used evicted first (an evicted key starts again from the prior); each is
three floats.

**Per tenant** (issue 46): the agent's kind is what a client's ``User-Agent`` says, so a tenant
that wrote a new one on every call would add a population per call and push every other
tenant's fits out of the ``max_keys``. So each tenant has fits of their own for at most
``max_agents`` (default 8; est.: Claude Code, Codex, Qwen Code, an SDK, ... a tenant runs a
handful) kinds, the first it is seen with while their fits are held; any other kind of that
tenant is learned as the tenant's ``POOLED_AGENT`` for the model. A tenant thus holds at most
(``max_agents`` + 1) fits per model, whatever it sends: rotating its ``User-Agent`` past that
only feeds its own pooled fit, and evicts nobody's. (A kind frees its place when its last fit
is evicted.)

**Session** (``SessionGaps``): the count n_s and sum S_s of its own ln(gap)s, blended with its
population's mean with a pseudo-count k_s (``session_weight``, default 3; est.):
μ_s = (k_s μ_pop + S_s) / (k_s + n_s); its σ is the population's (a session sees too few gaps
to fit its own spread).

**Prediction** (``predict``): median gap m = e^μ_s; hold = max(min(e^(μ_s + z_q σ), cap),
m + floor), z_q the standard normal q-quantile (q = 0.95 by default,
``runtime.scheduling.config.SchedulerConfig.gap_quantile`` says why), the cap the session idle
timeout 600 s (docs/sources.md §2), the floor 1 s. So the hold is always ≥ m + 1 s ≥ m, and
(below the cap) grows with q. The node holds the session's KV until now + max(hold, the mean
rule's hold) (``core.holds.plan_hold`` with ``hold_gap_s``); whether it reserves
and how long the reservation keeps the slot open stay the mean rule's.

Gaps are floored at ``MIN_GAP_S`` = 1 ms before the log (a call that arrives at the instant the
previous one finished would give ln 0).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

GAP_MIXTURE: tuple[tuple[float, float, float], ...] = ((0.96, 0.4, 1.3), (0.04, 35.0, 1.0))
"""docs/sources.md §2's fitted tool gap: (weight, median s, σ) of each log-normal part."""
MIN_GAP_S = 1e-3
"""Gaps are floored here before their log is taken, seconds."""
DEFAULT_QUANTILE = 0.95
DEFAULT_FLOOR_S = 1.0
DEFAULT_CAP_S = 600.0
"""The session idle timeout of docs/sources.md §2: no hold outlives a session's idle life."""
DEFAULT_PRIOR_WEIGHT = 20.0
DEFAULT_SESSION_WEIGHT = 3.0
DEFAULT_MAX_KEYS = 1024
DEFAULT_MAX_AGENTS = 8
POOLED_AGENT = "(pooled)"
"""The kind a tenant's kinds past ``max_agents`` are learned as (not an HTTP token, so no
``User-Agent`` names it: proxy/sessions/identity.py ``agent_kind``)."""

PopulationKey = tuple[str, str, str]
"""(tenant, model, agent): a population (module docstring)."""


def mixture_log_moments(parts: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """Mean and s.d. of ln(gap) under a mixture of log-normals ``(weight, median, σ)``
    (weights summing to 1): the formulas of the module docstring."""
    mean = sum(w * math.log(median) for w, median, _ in parts)
    second = sum(w * (sigma**2 + math.log(median) ** 2) for w, median, sigma in parts)
    return mean, math.sqrt(max(0.0, second - mean**2))


PRIOR_LOG_MEAN, PRIOR_LOG_SD = mixture_log_moments(GAP_MIXTURE)
"""μ0 = −0.7374, σ0 = 1.5589 (module docstring)."""


def log_gap(gap_s: float) -> float:
    """ln(max(gap_s, MIN_GAP_S))."""
    return math.log(max(gap_s, MIN_GAP_S))


@dataclass
class LogNormalFit:
    """One population's online log-normal: Welford over ln(gap), seeded with the prior as
    ``prior_weight`` observations (module docstring)."""

    n: float
    mean: float
    m2: float

    @classmethod
    def prior(
        cls,
        log_mean: float = PRIOR_LOG_MEAN,
        log_sd: float = PRIOR_LOG_SD,
        weight: float = DEFAULT_PRIOR_WEIGHT,
    ) -> LogNormalFit:
        """The fit before any gap: n = weight, mean = log_mean, M2 = weight · log_sd²."""
        return cls(weight, log_mean, weight * log_sd**2)

    def observe(self, gap_s: float) -> None:
        """Add one gap, seconds (Welford's update of ln(gap))."""
        x = log_gap(gap_s)
        self.n += 1.0
        delta = x - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (x - self.mean)

    @property
    def sd(self) -> float:
        """σ = √(M2 / n)."""
        return math.sqrt(self.m2 / self.n) if self.n > 0 else 0.0


class PopulationGaps:
    """The node's log-normal fits by population key, at most ``max_keys`` of them (least
    recently used evicted first; an evicted key starts again from the prior), and at most
    ``max_agents`` agent kinds of its own per tenant (past them, ``POOLED_AGENT``: module
    docstring)."""

    def __init__(
        self,
        max_keys: int = DEFAULT_MAX_KEYS,
        prior_weight: float = DEFAULT_PRIOR_WEIGHT,
        log_mean: float = PRIOR_LOG_MEAN,
        log_sd: float = PRIOR_LOG_SD,
        max_agents: int = DEFAULT_MAX_AGENTS,
    ) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        if max_agents < 1:
            raise ValueError(f"max_agents must be >= 1, got {max_agents}")
        self.max_keys = max_keys
        self.max_agents = max_agents
        self.prior_weight = prior_weight
        self.log_mean = log_mean
        self.log_sd = log_sd
        self._fits: OrderedDict[PopulationKey, LogNormalFit] = OrderedDict()
        self._kinds: dict[str, dict[str, int]] = {}
        """Tenant → each agent kind of its own (not pooled) → how many of its fits are held."""

    def __len__(self) -> int:
        return len(self._fits)

    def __contains__(self, key: object) -> bool:
        return key in self._fits

    def held_keys(self) -> list[PopulationKey]:
        """The keys held, least recently used first."""
        return list(self._fits)

    def key_of(self, key: PopulationKey) -> PopulationKey:
        """The key ``key``'s gaps are learned under: itself, or its tenant's pooled kind for
        the model when the tenant already has ``max_agents`` other kinds of its own."""
        tenant, model, agent = key
        kinds = self._kinds.get(tenant, {})
        if agent in kinds or agent == POOLED_AGENT or len(kinds) < self.max_agents:
            return key
        return (tenant, model, POOLED_AGENT)

    def fit(self, key: PopulationKey) -> LogNormalFit:
        """The fit ``key`` is learned under (``key_of``; a fresh prior for a key not held, not
        stored); marks it used."""
        held = self.key_of(key)
        found = self._fits.get(held)
        if found is None:
            return LogNormalFit.prior(self.log_mean, self.log_sd, self.prior_weight)
        self._fits.move_to_end(held)
        return found

    def peek(self, key: PopulationKey) -> LogNormalFit:
        """The fit ``key`` is learned under, as ``fit`` but not marked used."""
        found = self._fits.get(self.key_of(key))
        if found is None:
            return LogNormalFit.prior(self.log_mean, self.log_sd, self.prior_weight)
        return found

    def observe(self, key: PopulationKey, gap_s: float) -> None:
        """Add one gap of the population ``key`` is learned under (``key_of``), adding it and
        evicting the least recently used key past ``max_keys``."""
        held = self.key_of(key)
        found = self._fits.get(held)
        if found is None:
            found = LogNormalFit.prior(self.log_mean, self.log_sd, self.prior_weight)
            self._fits[held] = found
            self._count(held, 1)
            while len(self._fits) > self.max_keys:
                evicted, _ = self._fits.popitem(last=False)
                self._count(evicted, -1)
        else:
            self._fits.move_to_end(held)
        found.observe(gap_s)

    def _count(self, key: PopulationKey, delta: int) -> None:
        """A fit of ``key`` added (+1) or evicted (−1): its tenant's kinds follow."""
        tenant, _, agent = key
        if agent == POOLED_AGENT:
            return
        kinds = self._kinds.setdefault(tenant, {})
        held = kinds.get(agent, 0) + delta
        if held > 0:
            kinds[agent] = held
        else:
            kinds.pop(agent, None)
            if not kinds:
                del self._kinds[tenant]


@dataclass
class SessionGaps:
    """One session's own ln(gap)s: how many, and their sum."""

    count: int = 0
    log_sum: float = 0.0

    def observe(self, gap_s: float) -> None:
        """Add one of its gaps, seconds."""
        self.count += 1
        self.log_sum += log_gap(gap_s)

    def log_mean(self, population_mean: float, weight: float = DEFAULT_SESSION_WEIGHT) -> float:
        """μ_s = (k_s · population_mean + Σ ln g) / (k_s + n_s)."""
        return (weight * population_mean + self.log_sum) / (weight + self.count)


@dataclass(frozen=True)
class GapPrediction:
    """A session's predicted gap: its median and how long to hold a reservation, seconds."""

    median_s: float
    hold_s: float


def predict(
    log_mean: float,
    log_sd: float,
    *,
    quantile: float = DEFAULT_QUANTILE,
    floor_s: float = DEFAULT_FLOOR_S,
    cap_s: float = DEFAULT_CAP_S,
) -> GapPrediction:
    """Median e^μ and hold max(min(e^(μ + z_q σ), cap), median + floor) (module docstring)."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    median = math.exp(min(log_mean, 700.0))
    z = NormalDist().inv_cdf(quantile)
    upper = math.exp(min(log_mean + z * log_sd, 700.0))
    return GapPrediction(median, max(min(upper, cap_s), median + floor_s))


def predict_session(
    session: SessionGaps,
    population: LogNormalFit,
    *,
    session_weight: float = DEFAULT_SESSION_WEIGHT,
    quantile: float = DEFAULT_QUANTILE,
    floor_s: float = DEFAULT_FLOOR_S,
    cap_s: float = DEFAULT_CAP_S,
) -> GapPrediction:
    """The session's prediction: its blended log-mean, its population's σ (``predict``)."""
    mu = session.log_mean(population.mean, session_weight)
    return predict(mu, population.sd, quantile=quantile, floor_s=floor_s, cap_s=cap_s)
