"""Seeded market workloads: many listed models, a few take most of the sessions, the long tail is
cold most of the time (issue 48; every figure's source is in docs/sources.md §15).

Shares. Model j of the ``models`` (in rank order) has share ``s_j``: the first ``len(head)``
take the ``head`` shares (AI Ping, Q4 2025: 0.32, 0.20, 0.15, 0.11, 0.09 of the traffic for the
top five families), the others share ``1 − Σ head`` by Zipf(``tail_zipf_s``) over their tail
rank r (weight ``1 / (r + 1)^s``). With fewer models than head shares, the head is cut and
renormalised to 1.

Arrivals, per model, each from its own generator (``random.Random("<seed>:<model>")``: one
model's arrivals depend on its own share, CV and windows only, never on another's draws):

- a coefficient of variation ``c_j = cv_median · exp(σ z)``, z ~ N(0, 1), σ = ln(cv_p90 /
  cv_median) / 1.2816 (ServeGen: per-model inter-arrival CV median 1.17–1.32, p90 3.95–5.53);
- a renewal process of Gamma inter-arrivals (ServeGen: Gamma fits 70–83% of its models) of
  shape k = 1 / c_j² and mean 1 in *operational time* τ, stationary from t = 0 (the first
  arrival after the residual of a length-biased gap), mapped to wall time through the
  model's rate ``r_j(t) = rate · s_j · m_j(w(t)) · e(t)`` (τ = ∫ r_j dt, so each segment of
  constant rate keeps the CV):
  - ``m_j(w)``: a multiplier redrawn per ``window_s`` window, log-uniform in [``swing``]
    (Prism: rates swing more than 5× within minutes), divided by the log-uniform's mean
    ``(b − a) / ln(b / a)`` so that it averages 1;
  - ``e(t) = 1 + diurnal_amplitude · sin(2π t / day_s)`` (one day over the market's
    ``duration_s`` by default), evaluated at the middle of each ``step_s`` segment;
  - **bursty groups** (Prism: models active together): ``groups`` disjoint sets of 3–5 models
    drawn from the market's own generator share one multiplier per window (the group's first
    member's stream draws it).

Sessions: every arrival before ``duration_s`` is an agent session of its model, its calls drawn
as sim/workload.py draws them (call count, first context, outputs, appends, tool gaps: the
``body`` WorkloadSpec's distributions) from ``random.Random(seed + BODY_SEED)`` in start order;
sessions are named ``s0000``, ``s0001``, ... in start order. A listed model may get no session
in the window: it belongs to the market all the same (``MarketSpec.models``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from talaria.core.trace import SessionTrace
from talaria.sim.workload import (
    WorkloadSpec,
    draw_first_context,
    draw_num_calls,
    draw_session_calls,
    zipf_weights,
)

AI_PING_HEAD: tuple[float, ...] = (0.32, 0.20, 0.15, 0.11, 0.09)
"""The top five model families' shares of traffic (AI Ping, Q4 2025; docs/sources.md §15)."""

Z90 = 1.2815515655446004
"""The standard normal's 0.9 quantile."""

BODY_SEED = 0x0B0D7
"""Added to the market's seed for the sessions' bodies' generator."""


@dataclass(frozen=True)
class MarketSpec:
    """A market (module docstring): its listed models in rank order and how sessions arrive."""

    models: tuple[str, ...]
    sessions_per_s: float = 1.0 / 6.0
    """The market's mean session rate, all models together."""
    duration_s: float = 3600.0
    head: tuple[float, ...] = AI_PING_HEAD
    tail_zipf_s: float = 1.0
    cv_median: float = 1.2
    cv_p90: float = 5.0
    window_s: float = 600.0
    swing: tuple[float, float] = (0.2, 5.0)
    day_s: float | None = None
    """The diurnal envelope's period; None: ``duration_s`` (one day over the market)."""
    diurnal_amplitude: float = 0.5
    step_s: float = 60.0
    """The rate is constant over segments of this length."""
    groups: int = 2
    """Bursty groups of 3–5 models (fewer when the market has too few models)."""

    def __post_init__(self) -> None:
        if not self.models or len(set(self.models)) != len(self.models):
            raise ValueError(f"a market lists distinct models, got {self.models}")
        if not (self.sessions_per_s > 0 and self.duration_s > 0):
            raise ValueError("sessions_per_s and duration_s must be > 0")
        if not self.head or min(self.head) <= 0 or sum(self.head) > 1.0 + 1e-9:
            raise ValueError(f"head shares must be > 0 and sum to at most 1, got {self.head}")
        if not (0 < self.cv_median < self.cv_p90):
            raise ValueError("need 0 < cv_median < cv_p90")
        if not (0 < self.swing[0] <= 1.0 <= self.swing[1]):
            raise ValueError(f"swing must be (a, b) with 0 < a <= 1 <= b, got {self.swing}")
        if not (self.window_s > 0 and self.step_s > 0 and 0 <= self.diurnal_amplitude < 1):
            raise ValueError("need window_s > 0, step_s > 0 and diurnal_amplitude in [0, 1)")
        if self.groups < 0 or self.tail_zipf_s < 0:
            raise ValueError("groups and tail_zipf_s must be >= 0")

    def shares(self) -> dict[str, float]:
        """Each listed model's share of the sessions (module docstring); they sum to 1."""
        n, head = len(self.models), self.head
        if n <= len(head):
            cut = head[:n]
            return {m: s / sum(cut) for m, s in zip(self.models, cut, strict=True)}
        tail = zipf_weights(n - len(head), self.tail_zipf_s)
        left = 1.0 - sum(head)
        out = dict(zip(self.models, head, strict=False))
        rest = zip(self.models[len(head) :], tail, strict=True)
        out.update({m: left * w / sum(tail) for m, w in rest})
        return out


def aegaeon_head(
    head: Sequence[float] = AI_PING_HEAD, models: int = 3, carry: float = 0.9865
) -> tuple[float, ...]:
    """The first ``models`` head shares scaled to ``carry`` together (Aegaeon: the other 94.1%
    of models receive 1.35% of requests, so the top few carry 98.65%)."""
    top = head[:models]
    return tuple(carry * s / sum(top) for s in top)


def draw_groups(spec: MarketSpec, rng: random.Random) -> list[tuple[int, ...]]:
    """``spec.groups`` disjoint groups of 3–5 model indices (fewer where models run out)."""
    free = list(range(len(spec.models)))
    rng.shuffle(free)
    groups = []
    for _ in range(spec.groups):
        size = rng.randint(3, 5)
        if len(free) < 3:
            break
        groups.append(tuple(sorted(free[:size])))
        free = free[size:]
    return groups


def _log_uniform_mean(a: float, b: float) -> float:
    """The mean of a log-uniform on [a, b]: ``(b − a) / ln(b / a)`` (a when a = b)."""
    return a if a == b else (b - a) / math.log(b / a)


def window_multipliers(spec: MarketSpec, rng: random.Random, windows: int) -> list[float]:
    """One multiplier per window, log-uniform in ``spec.swing``, averaging 1."""
    a, b = spec.swing
    mean = _log_uniform_mean(a, b)
    return [math.exp(rng.uniform(math.log(a), math.log(b))) / mean for _ in range(windows)]


def envelope(spec: MarketSpec, t: float) -> float:
    """``1 + diurnal_amplitude · sin(2π t / day_s)``."""
    day = spec.day_s if spec.day_s is not None else spec.duration_s
    return 1.0 + spec.diurnal_amplitude * math.sin(2.0 * math.pi * t / day)


def draw_cv(spec: MarketSpec, rng: random.Random) -> float:
    """A model's inter-arrival CV: ``cv_median · exp(σ z)``, σ = ln(cv_p90 / cv_median) / z₀.₉."""
    return spec.cv_median * math.exp(math.log(spec.cv_p90 / spec.cv_median) / Z90 * rng.gauss())


def model_arrivals(
    spec: MarketSpec, share: float, multipliers: Sequence[float], rng: random.Random
) -> list[float]:
    """One model's arrival times in ``[0, duration_s)`` (module docstring): its CV from
    ``rng``, then Gamma gaps of mean 1 in operational time walked through the rate segments."""
    cv = draw_cv(spec, rng)
    shape = 1.0 / (cv * cv)
    base = spec.sessions_per_s * share
    out: list[float] = []
    # Operational time to the first arrival: the stationary residual (a length-biased gap,
    # Gamma(k + 1, 1/k), times a uniform), so that E[arrivals] = ∫ r dt from t = 0 on; a fresh
    # gap would add (c² − 1) / 2 arrivals at the start (renewal theory), 12 at c = 5.
    t, owed = 0.0, rng.random() * rng.gammavariate(shape + 1.0, 1.0 / shape)
    while t < spec.duration_s:
        end = min(spec.duration_s, (math.floor(t / spec.step_s) + 1) * spec.step_s)
        window = min(len(multipliers) - 1, int(t // spec.window_s))
        rate = base * multipliers[window] * envelope(spec, (t + end) / 2.0)
        if rate * (end - t) < owed:
            owed -= rate * (end - t)
            t = end
            continue
        t += owed / rate
        out.append(t)
        owed = rng.gammavariate(shape, 1.0 / shape)
    return [x for x in out if x < spec.duration_s]


def market_arrivals(spec: MarketSpec, seed: int) -> list[tuple[float, str]]:
    """Every session's (start, model) in the market, in start order (module docstring)."""
    shares = spec.shares()
    windows = max(1, math.ceil(spec.duration_s / spec.window_s))
    groups = draw_groups(spec, random.Random(seed))
    streams = {m: random.Random(f"{seed}:{m}") for m in spec.models}
    multipliers = {m: window_multipliers(spec, streams[m], windows) for m in spec.models}
    for group in groups:
        shared = multipliers[spec.models[group[0]]]
        for j in group[1:]:
            multipliers[spec.models[j]] = shared
    arrivals = [
        (round(t, 6), m)
        for m in spec.models
        for t in model_arrivals(spec, shares[m], multipliers[m], streams[m])
    ]
    return sorted(arrivals)


def market_sessions(
    spec: MarketSpec,
    body: WorkloadSpec,
    context_windows: Mapping[str, int],
    reasoning: Mapping[str, bool],
    seed: int,
) -> list[SessionTrace]:
    """The market's sessions (module docstring), their calls drawn with ``body``'s
    distributions (its ``sessions`` and arrival fields are not read)."""
    missing = [m for m in spec.models if m not in context_windows]
    if missing:
        raise ValueError(f"no context window given for {missing}")
    rng = random.Random(seed + BODY_SEED)
    sessions = []
    for k, (start, model) in enumerate(market_arrivals(spec, seed)):
        sid = f"s{k:04d}"
        count = draw_num_calls(rng, body)
        c0 = draw_first_context(rng, body)
        head = (sid, model, start, count, c0)
        calls = draw_session_calls(
            rng, body, head, context_windows[model], reasoning.get(model, False)
        )
        sessions.append(SessionTrace(sid, model, start, calls))
    return sessions
