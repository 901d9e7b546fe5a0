"""Fidelity: how well a replay predicts a live run (docs/fidelity.md).

A live run's exported trace (``talaria trace export``) carries, per call, what the proxy measured
(``latency_s``, ``ttft_s``) next to the workload (tokens, tool gaps). Replaying that trace on the
simulator with the calibrated profile predicts the same quantities; ``compare`` sets them side
by side.

Definitions (pred = replay, meas = live):

- relative error of one quantity: (pred − meas) / meas;
- per call: latency (answer complete − sent, as the proxy sees it: the replay adds its
  ``Transport`` hop to the node's latency) and TTFT (first token − arrival at the node: the
  runtime's queue + prefill, as the store records it);
- per session: SCT = last answer complete − first call sent; measured from the trace as
  ``arrival_offset_s`` + ``latency_s`` of the last call − ``arrival_offset_s`` of call 0;
- ``p50_sct_rel_error`` = |p50(pred SCT) − p50(meas SCT)| / p50(meas SCT), likewise p95;
- ``call_latency_median_rel_error`` = median over calls of |relative error of latency|.

The workload generator ``fidelity_workload`` draws sessions small enough for the tiny CPU
models (context ≤ 2048 tokens); it is seeded and uses one ``random.Random``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from talaria.core.trace import SessionTrace, TraceCall
from talaria.core.types import CallResult
from talaria.sim.metrics import percentile
from talaria.sim.replay import ReplayOutcome


@dataclass(frozen=True)
class FidelityWorkload:
    """Sessions for a live run on two tiny CPU models: uniform token draws in the ranges
    given, tool gaps lognormal(median, sigma) capped, Poisson session starts."""

    sessions: int = 8
    calls: int = 10
    models: tuple[str, ...] = ("tiny-a", "tiny-b")
    first_prompt_tokens: tuple[int, int] = (150, 400)
    new_tokens: tuple[int, int] = (10, 60)
    output_tokens: tuple[int, int] = (16, 64)
    gap_median_s: float = 0.5
    gap_sigma: float = 0.8
    gap_max_s: float = 4.0
    mean_interarrival_s: float = 1.5

    @property
    def max_context_tokens(self) -> int:
        """The longest prompt + output a session can reach."""
        per_call = self.new_tokens[1] + self.output_tokens[1]
        return self.first_prompt_tokens[1] + self.calls * per_call


def fidelity_workload(spec: FidelityWorkload, seed: int) -> list[SessionTrace]:
    """``spec.sessions`` sessions of ``spec.calls`` calls; session i uses model i mod len(models).
    Prompts are append-only: prompt(i) = prompt(i−1) + output(i−1) + new(i)."""
    rng = random.Random(seed)
    start = 0.0
    sessions = []
    for i in range(spec.sessions):
        sid = f"f{i:03d}"
        model = spec.models[i % len(spec.models)]
        prompt = rng.randint(*spec.first_prompt_tokens)
        new = prompt
        calls = []
        for j in range(spec.calls):
            output = rng.randint(*spec.output_tokens)
            last = j == spec.calls - 1
            gap = min(spec.gap_max_s, spec.gap_median_s * math.exp(spec.gap_sigma * rng.gauss()))
            calls.append(
                TraceCall(sid, j, model, start, prompt, new, output, None if last else gap)
            )
            new = rng.randint(*spec.new_tokens)
            prompt += output + new
        sessions.append(SessionTrace(sid, model, calls[0].arrival_offset_s, tuple(calls)))
        start += rng.expovariate(1.0 / spec.mean_interarrival_s)
    return sessions


def measured_sct_s(session: SessionTrace) -> float:
    """Last call's arrival offset + its measured latency − call 0's arrival offset."""
    last = session.calls[-1]
    if last.latency_s is None:
        raise ValueError(f"session {session.session_id}: the trace has no measured latency")
    return last.arrival_offset_s + last.latency_s - session.calls[0].arrival_offset_s


def _rel(pred: float, meas: float) -> float:
    return (pred - meas) / meas if meas > 0 else math.inf


def _abs_summary(errors: Sequence[float]) -> tuple[float, float]:
    magnitudes = [abs(e) for e in errors]
    return percentile(magnitudes, 50), percentile(magnitudes, 95)


def _engine_parts(result: CallResult) -> dict[str, float]:
    """The simulated engine's own split of admission → first token: until it was ready to
    join a step (``predicted_intake_s``), until its first step began (``predicted_wait_s``),
    that step (``predicted_step_s``)."""
    t = result.engine
    if t is None:
        return {}
    return {
        "predicted_intake_s": t.queued_s - result.admitted_s,
        "predicted_wait_s": t.scheduled_s - t.queued_s,
        "predicted_step_s": t.first_token_s - t.scheduled_s,
    }


def compare(live: Sequence[SessionTrace], predicted: ReplayOutcome) -> dict[str, Any]:
    """Per-call and per-session predicted-vs-measured figures (module docstring)."""
    by_id = {s.session_id: s for s in predicted.sessions}
    hop = predicted.transport.forward_s + predicted.transport.return_s
    calls: list[dict[str, Any]] = []
    sessions: list[dict[str, Any]] = []
    for session in live:
        outcome = by_id[session.session_id]
        for call, result in zip(session.calls, outcome.calls, strict=True):
            if call.latency_s is None or call.ttft_s is None:
                raise ValueError(f"{session.session_id}/{call.call_index}: no measured timing")
            calls.append(
                {
                    "session_id": session.session_id,
                    "call_index": call.call_index,
                    "model": session.model,
                    "measured_latency_s": call.latency_s,
                    "predicted_latency_s": result.latency_s + hop,
                    "measured_ttft_s": call.ttft_s,
                    "predicted_ttft_s": result.first_token_s - result.arrival_s,
                    "predicted_queue_s": result.admitted_s - result.arrival_s,
                    "predicted_prefill_s": result.first_token_s - result.admitted_s,
                    "predicted_decode_s": result.finished_s - result.first_token_s,
                    "predicted_hop_s": hop,
                    **_engine_parts(result),
                }
            )
        gaps = sum(c.tool_gap_s or 0.0 for c in session.calls)
        sessions.append(
            {
                "session_id": session.session_id,
                "model": session.model,
                "measured_sct_s": measured_sct_s(session),
                "predicted_sct_s": outcome.sct_s,
                "tool_s": gaps,
            }
        )
    return {"figures": error_figures(calls, sessions), "calls": calls, "sessions": sessions}


def _signature(session: SessionTrace) -> tuple[Any, ...]:
    """What a workload fixes of a session, whatever run recorded it: its model and each call's
    output tokens. (The store's session keys differ between runs, and prompts may differ by a
    token or two: their text is drawn anew and holds the model's replies, re-tokenized.)"""
    return (session.model, *(c.output_tokens for c in session.calls))


def _median(values: Sequence[float]) -> float:
    return percentile(list(values), 50)


def repeatability(runs: Sequence[Sequence[SessionTrace]]) -> list[dict[str, Any]]:
    """How well live runs of one workload predict each other: the floor under any model's
    error on this machine. For each run r, every call's "prediction" is the median of the
    other runs' measurements of that call (latency, TTFT; a session's SCT likewise), and
    ``error_figures`` compares run r with it. Sessions are matched across runs by
    ``_signature``; needs two runs or more of the same workload."""
    if len(runs) < 2:
        raise ValueError("repeatability needs at least two runs")
    keyed = [{_signature(s): s for s in run} for run in runs]
    keys = set(keyed[0])
    if any(set(k) != keys or len(k) != len(run) for k, run in zip(keyed, runs, strict=True)):
        raise ValueError("the runs are not of one workload: their sessions differ")
    out = []
    for r, run in enumerate(keyed):
        others = [k for i, k in enumerate(keyed) if i != r]
        calls: list[dict[str, Any]] = []
        sessions: list[dict[str, Any]] = []
        for key, session in run.items():
            peers = [o[key] for o in others]
            for i, call in enumerate(session.calls):
                same = [p.calls[i] for p in peers]
                calls.append(
                    {
                        "measured_latency_s": call.latency_s,
                        "predicted_latency_s": _median([c.latency_s or 0.0 for c in same]),
                        "measured_ttft_s": call.ttft_s,
                        "predicted_ttft_s": _median([c.ttft_s or 0.0 for c in same]),
                    }
                )
            sessions.append(
                {
                    "measured_sct_s": measured_sct_s(session),
                    "predicted_sct_s": _median([measured_sct_s(p) for p in peers]),
                    "tool_s": sum(c.tool_gap_s or 0.0 for c in session.calls),
                }
            )
        out.append(error_figures(calls, sessions))
    return out


def error_figures(
    calls: Sequence[dict[str, Any]], sessions: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """The module docstring's error figures from per-call (``measured_latency_s``,
    ``predicted_latency_s``, ``measured_ttft_s``, ``predicted_ttft_s``) and per-session
    (``measured_sct_s``, ``predicted_sct_s``, ``tool_s``) records; "predicted" may be another
    live run of the same workload (``repeatability``)."""
    lat = [_rel(c["predicted_latency_s"], c["measured_latency_s"]) for c in calls]
    ttft = [_rel(c["predicted_ttft_s"], c["measured_ttft_s"]) for c in calls]
    sct = [_rel(s["predicted_sct_s"], s["measured_sct_s"]) for s in sessions]
    meas_sct = [s["measured_sct_s"] for s in sessions]
    pred_sct = [s["predicted_sct_s"] for s in sessions]
    lat_med, lat_p95 = _abs_summary(lat)
    ttft_med, ttft_p95 = _abs_summary(ttft)
    sct_med, sct_p95 = _abs_summary(sct)
    figures: dict[str, Any] = {
        "sessions": len(sessions),
        "calls": len(calls),
        "measured_p50_sct_s": percentile(meas_sct, 50),
        "predicted_p50_sct_s": percentile(pred_sct, 50),
        "measured_p95_sct_s": percentile(meas_sct, 95),
        "predicted_p95_sct_s": percentile(pred_sct, 95),
        "p50_sct_rel_error": abs(_rel(percentile(pred_sct, 50), percentile(meas_sct, 50))),
        "p95_sct_rel_error": abs(_rel(percentile(pred_sct, 95), percentile(meas_sct, 95))),
        "sct_median_rel_error": sct_med,
        "sct_p95_rel_error": sct_p95,
        "call_latency_median_rel_error": lat_med,
        "call_latency_p95_rel_error": lat_p95,
        "call_latency_median_signed_rel_error": percentile(lat, 50),
        "ttft_median_rel_error": ttft_med,
        "ttft_p95_rel_error": ttft_p95,
        "tool_time_fraction": sum(s["tool_s"] for s in sessions) / sum(meas_sct),
    }
    return figures
