"""``talaria calibrate``, the pure part: the measurement plan, what was measured per model, the
fits (sim/fit.py) and the run's report.

The live driver that runs a plan against a runtime server over HTTP, and the method of each
measurement, is talaria/calibrate_live.py (the CLI layer: it may import the proxy's
``HttpRuntime``; nothing in sim/ does).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from talaria.sim.fit import FitReport, StepSample, fit_steps


@dataclass(frozen=True)
class CalibrationPlan:
    """The grid of measurements for one model (each point ``repeats`` times)."""

    prompt_tokens: tuple[int, ...] = (32, 128, 256, 512, 1024, 1536)
    cached_fractions: tuple[float, ...] = (0.0, 0.5, 0.9)
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    decode_contexts: tuple[int, ...] = (64, 512, 1024)
    decode_tokens: int = 48
    mixed_points: tuple[tuple[int, int], ...] = ((1, 64), (4, 64), (4, 256), (8, 128))
    """(decoding batch B, prompt tokens P) of the mixed-step measurements."""
    mixed_context: int = 512
    mixed_repeats: int = 1
    """Times each mixed point is measured within a pass, the median-time one kept: a mixed
    point is one engine step, so with a single pass one scheduling hiccup of the host would
    otherwise be the whole of ``mixed_step_s``."""
    shape_tokens: tuple[int, ...] = (97, 163, 229, 293, 359, 421)
    """Fresh prefill sizes for the first-use-of-a-shape measurement (``shape_pair``): sizes no
    other measurement of the plan uses."""
    repeats: int = 3
    idle_gaps_s: tuple[float, ...] = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
    """Idle times before a call, for the wake-up ladder (``StepFit.idle_wake``)."""
    idle_repeats: int = 5
    coresident_points: tuple[tuple[int, int, int], ...] = (
        (1, 1, 256),
        (1, 4, 256),
        (4, 1, 256),
        (4, 2, 256),
        (4, 4, 256),
        (4, 8, 256),
    )
    """(batch, the other model's batch, context) of the co-resident decode measurements (every
    ordered model pair): a spread of the loads co-resident engines meet, so that α, their
    median, stands for all of them."""
    coresident_repeats: int = 2

    def prefill_points(self, max_model_len: int) -> list[tuple[int, int]]:
        """(prompt tokens P, cached-prefix tokens asked C) with P + 2 ≤ max_model_len."""
        points = []
        for p in self.prompt_tokens:
            if p + 2 > max_model_len:
                continue
            for f in self.cached_fractions:
                points.append((p, int(p * f)))
        return points

    def decode_points(self, max_model_len: int) -> list[tuple[int, int]]:
        """(batch B, context L) with L + decode_tokens ≤ max_model_len."""
        return [
            (b, c)
            for c in self.decode_contexts
            if c + self.decode_tokens <= max_model_len
            for b in self.batch_sizes
        ]

    def count(self, max_model_len: int, others: int = 0) -> int:
        """Measurements of one model; ``others``: models it is measured beside (co-resident)."""
        points = self.prefill_points(max_model_len) + self.decode_points(max_model_len)
        points += self.mixed_points_for(max_model_len)
        warm = len(self.prefill_points(max_model_len)) + len(self.mixed_points_for(max_model_len))
        coresident = others * len(self.coresident_points) * self.coresident_repeats
        shapes = len(self.shape_tokens)
        return warm + len(points) * self.repeats + len(self.idle_gaps_s) + shapes + coresident

    def mixed_points_for(self, max_model_len: int) -> list[tuple[int, int]]:
        """(B, P) with the decoders' context + output and the prompt within max_model_len."""
        room = max_model_len - self.mixed_context - 2 * self.decode_tokens
        return [(b, p) for b, p in self.mixed_points if room >= 0 and p + 2 <= max_model_len]


QUICK_PLAN = CalibrationPlan(
    prompt_tokens=(64, 512, 1024),
    cached_fractions=(0.0, 0.5),
    batch_sizes=(1, 4, 8),
    decode_contexts=(64, 768),
    decode_tokens=32,
    mixed_points=((4, 128),),
    mixed_repeats=3,
    shape_tokens=(97, 229, 359),
    repeats=1,
    idle_gaps_s=(0.0, 0.1, 1.0),
    idle_repeats=3,
    coresident_points=((4, 4, 256),),
    coresident_repeats=1,
)
"""A smaller grid for CI (about a tenth of the default's calls)."""


@dataclass
class ModelCalibration:
    """What was measured on one model (talaria/calibrate_live.py fills it), and its fit."""

    model: str
    samples: list[StepSample] = field(default_factory=list)
    idle_ttft_s: dict[float, list[float]] = field(default_factory=dict)
    """Idle seconds before a call → its admission-to-first-token times."""
    switch_s: list[float] = field(default_factory=list)
    intake_s: list[float] = field(default_factory=list)
    """Engine-timed intakes of the prefill calls (``Calibrator.prefill``, in
    talaria/calibrate_live.py); empty without the engine's timestamps (the fit's
    ``call_overhead_s`` is then fitted from whole prefills)."""
    shape_pairs: list[tuple[int, float, float]] = field(default_factory=list)
    """(tokens, first step s, repeated step s) of ``Calibrator.shape_pair``."""

    def new_shape_s(self) -> float:
        """median(first − repeated step) over the shape pairs, floored at 0 (0: none)."""
        if not self.shape_pairs:
            return 0.0
        return max(0.0, statistics.median(first - again for _, first, again in self.shape_pairs))

    def fit(self) -> FitReport:
        """The step fit of ``samples``, with the idle ladder, the first use of a shape and,
        where measured, the median engine-timed intake as ``call_overhead_s``."""
        report = fit_steps(self.samples)
        fit = replace(report.fit, idle_wake=self.idle_wake(), new_shape_s=self.new_shape_s())
        if self.intake_s:
            fit = replace(fit, call_overhead_s=statistics.median(self.intake_s))
        return replace(report, fit=fit)

    def idle_wake(self) -> tuple[tuple[float, float], ...]:
        """(idle s, extra s) points: median TTFT after that idle − the median at the shortest
        idle, floored at 0 and made non-decreasing (a running maximum) so that noise cannot
        make a longer sleep look cheaper."""
        if not self.idle_ttft_s:
            return ()
        gaps = sorted(self.idle_ttft_s)
        base = statistics.median(self.idle_ttft_s[gaps[0]])
        points, high = [], 0.0
        for gap in gaps:
            high = max(high, statistics.median(self.idle_ttft_s[gap]) - base)
            points.append((gap, high))
        return tuple(points)


def switch_times(status: dict[str, Any], model: str) -> list[float]:
    """``switch_s`` of ``model``'s slots in a runtime status document (its recent slots)."""
    return [float(s["switch_s"]) for s in status.get("slots", []) if s.get("model") == model]


def check_models(status: dict[str, Any], models: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The runtime's engine info for ``models``; a clear error for one it does not host."""
    engines: dict[str, dict[str, Any]] = status.get("engines", {})
    missing = [m for m in models if m not in engines]
    if missing:
        hosted = ", ".join(sorted(engines)) or "none"
        raise ValueError(f"the runtime does not host {', '.join(missing)} (it hosts: {hosted})")
    return {m: engines[m] for m in models}


@dataclass(frozen=True)
class CalibrationRun:
    """What ``run_calibration`` (talaria/calibrate_live.py) measured, fitted and learned about
    the engines."""

    models: dict[str, ModelCalibration]
    fits: dict[str, FitReport]
    max_num_batched_tokens: int
    block_tokens: int
    switches_measurable: bool
    hops_s: list[float]
    coresident: list[dict[str, Any]] = field(default_factory=list)
    """The co-resident decode points (``Calibrator.coresident``), with each prediction."""

    @property
    def interference(self) -> float | None:
        """α = median(shared ÷ alone − 1) over the co-resident points (None: not measured)."""
        if not self.coresident:
            return None
        return max(0.0, statistics.median(float(p["ratio"]) - 1.0 for p in self.coresident))

    def coresident_errors(self) -> list[float]:
        """|alone × (1 + α) − shared| ÷ shared per point: how well α predicts each."""
        alpha = self.interference
        if alpha is None:
            return []
        return [
            abs(p["alone_s"] * (1 + alpha) - p["shared_s"]) / p["shared_s"] for p in self.coresident
        ]

    @property
    def hop_s(self) -> float:
        """Median HTTP hop of a call (request + response), split half each way in the
        profile's transport: this client is the proxy's (``HttpRuntime``), but the proxy's
        own work and its occasional status read are not in it."""
        return statistics.median(self.hops_s) if self.hops_s else 0.0

    def report(self) -> dict[str, Any]:
        """A JSON-ready record: every sample with its fitted residual, and the coefficients."""
        out: dict[str, Any] = {
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_tokens": self.block_tokens,
            "switches_measurable": self.switches_measurable,
            "hop_s": self.hop_s,
            "hops_s": self.hops_s,
            "coresident_interference": self.interference,
            "coresident": [
                {
                    **p,
                    "predicted_s": p["alone_s"] * (1 + (self.interference or 0.0)),
                    "abs_rel_error": e,
                }
                for p, e in zip(self.coresident, self.coresident_errors(), strict=True)
            ],
            "models": {},
        }
        for name, cal in self.models.items():
            fit = self.fits[name]
            out["models"][name] = {
                "fit": asdict(fit.fit),
                "median_abs_rel_residual": fit.median_abs_rel_residual,
                "max_abs_rel_residual": fit.max_abs_rel_residual,
                "rms_rel_residual": fit.rms_rel_residual,
                "switch_s": cal.switch_s,
                "idle_ttft_s": {str(k): v for k, v in cal.idle_ttft_s.items()},
                "intake_s": cal.intake_s,
                "shape_pairs": cal.shape_pairs,
                "samples": [
                    {**asdict(s), "rel_residual": r}
                    for s, r in zip(cal.samples, fit.rel_residuals, strict=True)
                ],
            }
        return out


def plan_default_batched(info: dict[str, Any]) -> int:
    """An engine that does not report its token budget: the max_model_len (one whole prompt
    per step, vLLM's floor)."""
    return int(info["max_model_len"])
