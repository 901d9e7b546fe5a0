"""Seeded generator of SWE-bench-style agent sessions (docs/sources.md §2, "Fitted distributions").

Every draw comes from one ``random.Random(seed)`` in a fixed order, and each draw consumes the
same randomness whatever the parameters, so e.g. sweeping ``mean_interarrival_s`` rescales the
start times of otherwise identical sessions. ``lognormal(m, σ)`` below is ``m · exp(σ · z)``
with z ~ N(0, 1): median m, mean ``m · exp(σ²/2)``.

Per session k (in index order): inter-arrival ``−mean_interarrival_s · ln(1 − u)`` (Poisson
arrivals; session 0 starts at t = 0, its u is drawn and unused), model j with probability
∝ ``1 / (j + 1)^zipf_s``, call count ``clamp(round(lognormal(calls_median, calls_sigma)), 1,
calls_max)``, initial context ``C0 = max(1, round(lognormal(c0_median, c0_sigma)))``.
Then, if ``total_calls`` is set, counts are rescaled to sum to it (``rescale_counts``). Then per
call i: output o_i, appended a_i, tool gap g_i (drawn for every call; a_0 and the last gap are
unused). Context: ``p_0 = C0``, ``p_i = p_{i−1} + o_{i−1} + a_i``, capped at
``window − o_i`` (outputs are capped at ``window // 2``). ``new_0 = p_0``;
``new_i = p_i − (p_{i−1} + o_{i−1})``, or ``p_i`` when the cap makes the prompt shorter than the
previous prompt + output (a truncation: the history is rewritten, nothing is reused).
Generated traces carry no observed send time for later calls: every call's ``arrival_offset_s``
is the session start, and only call 0's value is meaningful (the replay is closed-loop).

Demand that shifts (``day_s > 0``): model j's weight at time t is its Zipf weight times
``1 + diurnal_amplitude · sin(2π (t / day_s + j / n))`` (n models; the phases spread evenly, so
the hot set rotates while the total rate stays Poisson), times ``burst_factor`` inside one of
its bursts. Bursts: ``bursts_per_day`` per ``day_s``, each on a model drawn by Zipf weight,
starting uniformly in the sessions' span estimate ``sessions · mean_interarrival_s`` and lasting
``burst_s``; they come from their own ``random.Random(seed + BURST_SEED)``, so the sessions'
draws are the same with or without them (the model draw's one uniform is read against the
weights at the session's start).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from talaria.core.trace import SessionTrace, TraceCall


@dataclass(frozen=True)
class WorkloadSpec:
    """What to generate; distribution defaults are docs/sources.md §2's fitted values (est.)."""

    sessions: int
    models: tuple[str, ...]
    total_calls: int | None = None  # paper preset: 960 calls over 30 sessions (docs/sources.md §1)
    # Model popularity: weight of model j = 1 / (j + 1)^zipf_s. Assumption: the paper's abstract
    # speaks of popularity-skewed model catalogs; the Zipf shape and s = 1 are ours.
    zipf_s: float = 1.0
    # Poisson arrivals. Assumption: the paper does not state its arrival pattern; sweeps vary
    # this. 0 means every session starts at t = 0.
    mean_interarrival_s: float = 10.0
    # Calls per session: lognormal median 28, sigma 0.5 (mean ~32 = 960/30, docs/sources.md §1-2),
    # clamped to [1, 250] (docs/sources.md §2 cap).
    calls_median: float = 28.0
    calls_sigma: float = 0.5
    calls_max: int = 250
    # Initial context C0: median 6000 tokens (docs/sources.md §2: ~6k, SWE-agent style 1.5-7k); the
    # spread sigma 0.3 is an assumption.
    c0_median: float = 6000.0
    c0_sigma: float = 0.3
    # Tokens appended per call (tool output + action): lognormal median 550, sigma 1.1
    # (mean ~1,000; docs/sources.md §2 from modal-labs / nilenso growth of ~740-1,100 per call).
    append_median: float = 550.0
    append_sigma: float = 1.1
    # Output tokens per call: lognormal median 150, sigma 0.9 (mean ~225; docs/sources.md §2,
    # nilenso ~110-230 visible); reasoning models median 400, sigma 1.0 (TraceLab ~520 mean).
    output_median: float = 150.0
    output_sigma: float = 0.9
    reasoning_output_median: float = 400.0
    reasoning_output_sigma: float = 1.0
    # Tool gap: 96% lognormal(0.4 s, 1.3) + 4% lognormal(35 s, 1.0): median ~0.42 s, mean
    # ~3.2 s, ~4% over 10 s (docs/sources.md §2, nilenso report and TraceLab).
    gap_long_fraction: float = 0.04
    gap_short_median_s: float = 0.4
    gap_short_sigma: float = 1.3
    gap_long_median_s: float = 35.0
    gap_long_sigma: float = 1.0
    # Demand that shifts over a day (module docstring); day_s = 0: constant Zipf shares.
    # Assumption: the shape (a sine per model, phases spread evenly, bursts) is ours; production
    # LLM traffic varies over time and in bursts (docs/sources.md §12).
    day_s: float = 0.0
    diurnal_amplitude: float = 0.0
    bursts_per_day: float = 0.0
    burst_s: float = 300.0
    burst_factor: float = 4.0

    def __post_init__(self) -> None:
        if self.sessions < 1:
            raise ValueError(f"sessions must be >= 1, got {self.sessions}")
        if not self.models or len(set(self.models)) != len(self.models):
            raise ValueError(f"models must be non-empty and distinct, got {self.models}")
        if self.total_calls is not None and self.total_calls < self.sessions:
            raise ValueError(f"total_calls {self.total_calls} < sessions {self.sessions}")
        if self.mean_interarrival_s < 0 or self.calls_max < 1:
            raise ValueError("mean_interarrival_s must be >= 0 and calls_max >= 1")
        if not 0.0 <= self.gap_long_fraction <= 1.0:
            raise ValueError(f"gap_long_fraction must be in [0, 1], got {self.gap_long_fraction}")
        if self.day_s < 0 or not 0.0 <= self.diurnal_amplitude < 1.0:
            raise ValueError("day_s must be >= 0 and diurnal_amplitude in [0, 1)")
        if self.bursts_per_day < 0 or self.burst_s <= 0 or self.burst_factor < 1:
            raise ValueError("need bursts_per_day >= 0, burst_s > 0 and burst_factor >= 1")


BURST_SEED = 0x5EED_B0
"""Added to the workload's seed for the bursts' own generator."""


@dataclass(frozen=True)
class Burst:
    """Model ``model``'s demand × ``WorkloadSpec.burst_factor`` in ``[start_s, end_s)``."""

    model: int
    start_s: float
    end_s: float


def draw_bursts(spec: WorkloadSpec, seed: int) -> list[Burst]:
    """The bursts of a workload (module docstring): ``round(bursts_per_day × span / day_s)``
    of them over the span ``sessions · mean_interarrival_s``; none without a day."""
    span = spec.sessions * spec.mean_interarrival_s
    if spec.day_s <= 0 or spec.bursts_per_day <= 0 or span <= 0:
        return []
    rng = random.Random(seed + BURST_SEED)
    weights = zipf_weights(len(spec.models), spec.zipf_s)
    bursts = []
    for _ in range(round(spec.bursts_per_day * span / spec.day_s)):
        model = rng.choices(range(len(weights)), weights=weights)[0]
        start = rng.uniform(0.0, span)
        bursts.append(Burst(model, start, start + spec.burst_s))
    return bursts


def demand_weights(spec: WorkloadSpec, t: float, bursts: Sequence[Burst] = ()) -> list[float]:
    """Each model's weight at time ``t`` (module docstring); the Zipf weights without a day."""
    weights = zipf_weights(len(spec.models), spec.zipf_s)
    if spec.day_s <= 0:
        return weights
    n, a = len(weights), spec.diurnal_amplitude
    out = [
        w * (1.0 + a * math.sin(2 * math.pi * (t / spec.day_s + j / n)))
        for j, w in enumerate(weights)
    ]
    for burst in bursts:
        if burst.start_s <= t < burst.end_s:
            out[burst.model] *= spec.burst_factor
    return out


PAPER_WORKLOAD = WorkloadSpec(
    sessions=30,
    models=("glm-4.5-fp8", "qwen3-235b-a22b-bf16", "qwen3-coder-480b-a35b-fp8"),
    total_calls=960,
)
"""docs/sources.md §1: 30 SWE-Bench sessions, 960 calls, three models over 100B parameters."""


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    """``median · exp(sigma · z)``, z ~ N(0, 1)."""
    return median * math.exp(sigma * rng.normalvariate(0.0, 1.0))


def zipf_weights(n: int, s: float) -> list[float]:
    """``1 / (j + 1)^s`` for j = 0..n-1."""
    return [1.0 / (j + 1) ** s for j in range(n)]


def draw_model_index(
    rng: random.Random, spec: WorkloadSpec, t: float = 0.0, bursts: Sequence[Burst] = ()
) -> int:
    """Model index j with probability ∝ its weight at time ``t`` (``demand_weights``; without
    a day, ``1 / (j + 1)^zipf_s``): one uniform draw."""
    weights = demand_weights(spec, t, bursts)
    return rng.choices(range(len(weights)), weights=weights)[0]


def draw_num_calls(rng: random.Random, spec: WorkloadSpec) -> int:
    """``clamp(round(lognormal(calls_median, calls_sigma)), 1, calls_max)``."""
    return max(1, min(spec.calls_max, round(_lognormal(rng, spec.calls_median, spec.calls_sigma))))


def draw_first_context(rng: random.Random, spec: WorkloadSpec) -> int:
    """``C0 = max(1, round(lognormal(c0_median, c0_sigma)))``."""
    return max(1, round(_lognormal(rng, spec.c0_median, spec.c0_sigma)))


def draw_output_tokens(rng: random.Random, spec: WorkloadSpec, reasoning: bool) -> int:
    """``max(1, round(lognormal(median, sigma)))`` with the reasoning or plain parameters."""
    if reasoning:
        median, sigma = spec.reasoning_output_median, spec.reasoning_output_sigma
    else:
        median, sigma = spec.output_median, spec.output_sigma
    return max(1, round(_lognormal(rng, median, sigma)))


def draw_appended_tokens(rng: random.Random, spec: WorkloadSpec) -> int:
    """``max(0, round(lognormal(append_median, append_sigma)))``."""
    return max(0, round(_lognormal(rng, spec.append_median, spec.append_sigma)))


def draw_tool_gap(rng: random.Random, spec: WorkloadSpec) -> float:
    """Mixture: with probability ``gap_long_fraction`` the long lognormal, else the short one.

    Draws one uniform and one normal whichever branch is taken.
    """
    long = rng.random() < spec.gap_long_fraction
    z = rng.normalvariate(0.0, 1.0)
    if long:
        return spec.gap_long_median_s * math.exp(spec.gap_long_sigma * z)
    return spec.gap_short_median_s * math.exp(spec.gap_short_sigma * z)


def rescale_counts(counts: Sequence[int], total: int) -> list[int]:
    """Scale ``counts`` to sum to exactly ``total``, each at least 1 (needs total >= len).

    x_k = counts_k · total / sum; take floor(x_k), raised to 1 where it is 0; hand the remainder
    out one each by largest fractional part of x_k (ties: lower index first; raised sessions
    last). If the raises
    overshoot ``total``, take one call at a time from the largest count (ties: smallest
    fractional part, then higher index).
    """
    if total < len(counts) or not counts or min(counts) < 1:
        raise ValueError(f"cannot give {len(counts)} sessions >= 1 call each from {total}")
    raw = sum(counts)
    scaled = [c * total / raw for c in counts]
    out = [max(1, math.floor(x)) for x in scaled]
    frac = [x - math.floor(x) for x in scaled]
    left = total - sum(out)
    if left > 0:  # raised sessions (x_k < 1) already got their extra call: they come last
        order = sorted(range(len(out)), key=lambda k: (scaled[k] < 1, -frac[k], k))
        for k in order[:left]:
            out[k] += 1
    while left < 0:
        k = min((k for k in range(len(out)) if out[k] > 1), key=lambda k: (-out[k], frac[k], -k))
        out[k] -= 1
        left += 1
    return out


def draw_session_calls(
    rng: random.Random,
    spec: WorkloadSpec,
    head: tuple[str, str, float, int, int],
    window: int,
    reasoning: bool,
) -> tuple[TraceCall, ...]:
    """Calls of one session; ``head`` is (id, model, start, call count, C0)."""
    sid, model, start, n, c0 = head
    max_out = max(1, window // 2)
    calls: list[TraceCall] = []
    prev_end = 0  # p_{i-1} + o_{i-1}
    for i in range(n):
        out = min(max_out, draw_output_tokens(rng, spec, reasoning))
        appended = draw_appended_tokens(rng, spec)
        gap = round(draw_tool_gap(rng, spec), 6)
        wanted = c0 if i == 0 else prev_end + appended
        prompt = max(1, min(wanted, window - out))
        new = prompt if i == 0 or prompt < prev_end else prompt - prev_end
        calls.append(TraceCall(sid, i, model, start, prompt, new, out, gap if i < n - 1 else None))
        prev_end = prompt + out
    return tuple(calls)


def generate_sessions(
    spec: WorkloadSpec,
    context_windows: Mapping[str, int],
    reasoning: Mapping[str, bool],
    seed: int,
) -> list[SessionTrace]:
    """Sessions "s0000", "s0001", ... ordered by start time (see the module docstring).

    ``context_windows`` must name every model of ``spec``; a model missing from ``reasoning``
    counts as non-reasoning.
    """
    missing = [m for m in spec.models if m not in context_windows]
    if missing:
        raise ValueError(f"no context window given for {missing}")
    small = {m: context_windows[m] for m in spec.models if context_windows[m] < 2}
    if small:
        raise ValueError(f"context windows must be >= 2 tokens, got {small}")
    rng = random.Random(seed)
    bursts = draw_bursts(spec, seed)
    starts: list[float] = []
    models: list[str] = []
    counts: list[int] = []
    c0s: list[int] = []
    t = 0.0
    for k in range(spec.sessions):
        u = rng.random()
        if k > 0:
            t += -spec.mean_interarrival_s * math.log(1.0 - u)
        starts.append(round(t, 6))
        models.append(spec.models[draw_model_index(rng, spec, t, bursts)])
        counts.append(draw_num_calls(rng, spec))
        c0s.append(draw_first_context(rng, spec))
    if spec.total_calls is not None:
        counts = rescale_counts(counts, spec.total_calls)
    sessions = []
    for k in range(spec.sessions):
        sid, model = f"s{k:04d}", models[k]
        head = (sid, model, starts[k], counts[k], c0s[k])
        window, thinks = context_windows[model], reasoning.get(model, False)
        calls = draw_session_calls(rng, spec, head, window, thinks)
        sessions.append(SessionTrace(sid, model, starts[k], calls))
    return sessions
