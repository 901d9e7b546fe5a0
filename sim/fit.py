"""Fitting a ``StepFit`` to measured engine steps (``talaria calibrate``), and writing it out.

Each measurement is one engine step (or the mean of a run of equal steps): the tokens it
processed ``n``, its attention token pairs, its sequences, whether it includes a call's intake
(a prefill timed from admission to first token does; a decode step does not), whether it mixed
a prefill chunk with decoding sequences, and the seconds it took. The model
(``talaria.core.efficiency_profile.StepFit``) is linear in its six coefficients:

    t = overhead_s + s_per_token·n + s_per_pair·pairs + s_per_seq·seqs + call_overhead_s·intake
        + mixed_step_s·mixed

and is fitted by weighted least squares with weights 1 / t (so each point counts by its
*relative* error: a 5 ms decode step as much as a 200 ms prefill). A coefficient that comes out
negative has no physical meaning (a step cannot get faster with more work); it is fixed at 0 and
the rest refitted, until none is negative (an active-set simplification of NNLS; with six
columns it ends in at most seven rounds). Without mixed samples the mixed column is all zeros
and its coefficient comes out 0 (least squares' minimum-norm solution).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from talaria.core.efficiency_profile import StepFit

COEFFICIENTS = (
    "overhead_s",
    "s_per_token",
    "s_per_pair",
    "s_per_seq",
    "call_overhead_s",
    "mixed_step_s",
)


@dataclass(frozen=True)
class StepSample:
    """One measured step: what it held and how long it took."""

    kind: str
    """"prefill", "decode" or "mixed" (reporting only)."""
    tokens: int
    pairs: float
    seqs: int
    seconds: float
    intake: int = 0
    """Calls whose intake the time includes (1 for a prefill timed from admission)."""
    mixed: int = 0
    """1 for a step that held prefill chunks and decoding sequences both."""


@dataclass(frozen=True)
class FitReport:
    """A fitted ``StepFit``, how many samples it came from, and how well it predicts them."""

    fit: StepFit
    samples: int
    rel_residuals: tuple[float, ...]
    """(predicted − measured) / measured, per sample, in sample order."""

    @property
    def median_abs_rel_residual(self) -> float:
        """median |(predicted − measured) / measured| over the samples."""
        return float(np.median(np.abs(self.rel_residuals)))

    @property
    def max_abs_rel_residual(self) -> float:
        """max |(predicted − measured) / measured| over the samples."""
        return float(np.max(np.abs(self.rel_residuals)))

    @property
    def rms_rel_residual(self) -> float:
        """√(mean of ((predicted − measured) / measured)²) over the samples."""
        return math.sqrt(float(np.mean(np.square(self.rel_residuals))))


def _design(samples: Sequence[StepSample]) -> np.ndarray:
    return np.array(
        [[1.0, s.tokens, s.pairs, s.seqs, s.intake, s.mixed] for s in samples], dtype=float
    )


def fit_steps(samples: Sequence[StepSample]) -> FitReport:
    """Weighted (1/t) least squares of ``StepFit`` on ``samples``, coefficients ≥ 0."""
    if len(samples) < len(COEFFICIENTS):
        raise ValueError(f"need at least {len(COEFFICIENTS)} samples, got {len(samples)}")
    if any(s.seconds <= 0 or not math.isfinite(s.seconds) for s in samples):
        raise ValueError("every sample needs a positive, finite duration")
    x = _design(samples)
    t = np.array([s.seconds for s in samples])
    w = 1.0 / t
    xw, tw = x * w[:, None], t * w
    free = list(range(len(COEFFICIENTS)))
    coef = np.zeros(len(COEFFICIENTS))
    while free:
        solution, *_ = np.linalg.lstsq(xw[:, free], tw, rcond=None)
        coef = np.zeros(len(COEFFICIENTS))
        coef[free] = solution
        negative = [i for i in free if coef[i] < 0]
        if not negative:
            break
        free.remove(min(negative, key=lambda i: coef[i]))
    v = [float(max(0.0, x)) for x in coef]
    fit = StepFit(
        overhead_s=v[0],
        s_per_token=v[1],
        s_per_pair=v[2],
        s_per_seq=v[3],
        call_overhead_s=v[4],
        mixed_step_s=v[5],
    )
    predicted = x @ np.array([getattr(fit, c) for c in COEFFICIENTS])
    residuals = tuple(float(r) for r in (predicted - t) / t)
    return FitReport(fit, len(samples), residuals)


def profile_toml(
    name: str,
    fits: dict[str, FitReport],
    *,
    max_num_batched_tokens: int,
    block_tokens: int,
    source: str,
    hop_s: float = 0.0,
    interference: float | None = None,
    interference_note: str = "",
) -> str:
    """A catalog file holding one ``[profile]`` (with the call's HTTP hop ``hop_s`` split half
    each way as its transport, and the measured ``coresident_interference`` if given) and a
    ``[profile.fitted.<model>]`` table per model; the fit quality goes in comments (the
    catalog reads only the coefficients)."""
    lines = [
        f"# Measured by `talaria calibrate` ({source}).",
        "# Step time t = overhead_s + s_per_token·n + s_per_pair·pairs + s_per_seq·seqs",
        "# + mixed_step_s for a step mixing prefill and decode (StepFit,",
        "# talaria.core.efficiency_profile), fitted by weighted least squares (sim/fit.py).",
        "",
        "[profile]",
        f'name = "{name}"',
        f"max_num_batched_tokens = {max_num_batched_tokens}",
        f"block_tokens = {block_tokens}",
        f"# median HTTP hop of a call, {hop_s * 1e3:.2f} ms, half each way",
        f"transport_forward_s = {hop_s / 2:.6e}",
        f"transport_return_s = {hop_s / 2:.6e}",
    ]
    if interference is not None:
        lines += [
            f"# a step's growth while another engine decodes beside it{interference_note}",
            f"coresident_interference = {interference:.6e}",
        ]
    for model, report in sorted(fits.items()):
        lines += [
            "",
            f"# {model}: {report.samples} samples; |relative residual| median "
            f"{report.median_abs_rel_residual:.1%}, max {report.max_abs_rel_residual:.1%}, "
            f"rms {report.rms_rel_residual:.1%}",
            f'[profile.fitted."{model}"]',
        ]
        lines += [f"{c} = {getattr(report.fit, c):.6e}" for c in COEFFICIENTS]
        if report.fit.new_shape_s:
            lines.append(f"new_shape_s = {report.fit.new_shape_s:.6e}")
        if report.fit.idle_wake:
            points = ", ".join(f"[{i:g}, {e:.6e}]" for i, e in report.fit.idle_wake)
            lines.append(f"idle_wake = [{points}]")
    return "\n".join(lines) + "\n"
