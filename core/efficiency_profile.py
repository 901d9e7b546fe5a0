"""What an engine achieves on a server (``EfficiencyProfile``, one ``[profile]`` table of the
catalog): fractions of peak, fixed overheads, transport times, and per model the step times
fitted on a real engine (``StepFit``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise


@dataclass(frozen=True)
class StepFit:
    """A measured engine step time, fitted by ``talaria calibrate`` (least squares):

    t_step = overhead_s + s_per_token × n + s_per_pair × pairs + s_per_seq × seqs
             + mixed_step_s × [the step holds prefill chunks and decoding sequences both]

    n: tokens in the step (prefill chunk tokens + one per decoding sequence); pairs: attention
    token pairs (decode: the total context; a chunk of t tokens after c: t·c + t²/2); seqs:
    sequences in the step. ``mixed_step_s`` is what a step costs for mixing the two kinds (on
    vLLM's CPU build a mixed step costs about a prefill step plus a decode step, more than one
    shared overhead; docs/fidelity.md). It replaces the roofline's max(compute, memory) for
    its model.
    ``call_overhead_s`` is once per call, before its first step can take it: the engine's
    intake (tokenizing, handing the request to the engine process, scheduling it).
    ``idle_wake`` adds to the intake of a call that finds the engine idle: points
    (idle seconds, extra seconds), interpolated linearly and held flat past both ends (an
    engine that has slept longer answers its next call later; ``talaria calibrate`` measures
    the ladder). ``new_shape_s`` adds to a step whose token count n the engine has not run
    before (vLLM's CPU build builds its matrix-product kernels per shape and keeps them: a
    prefill of a fresh size costs 4–6 ms more the first time here; docs/fidelity.md)."""

    overhead_s: float
    s_per_token: float
    s_per_pair: float
    s_per_seq: float
    call_overhead_s: float = 0.0
    idle_wake: tuple[tuple[float, float], ...] = ()
    mixed_step_s: float = 0.0
    new_shape_s: float = 0.0

    def __post_init__(self) -> None:
        points = tuple((float(i), float(e)) for i, e in self.idle_wake)
        if any(b[0] <= a[0] for a, b in pairwise(points)):
            raise ValueError(f"idle_wake idle times must increase: {points}")
        object.__setattr__(self, "idle_wake", points)

    def wake_s(self, idle_s: float) -> float:
        """Extra intake after ``idle_s`` idle: ``idle_wake`` interpolated (0 with no points)."""
        points = self.idle_wake
        if not points:
            return 0.0
        if idle_s <= points[0][0]:
            return points[0][1]
        for (x0, y0), (x1, y1) in pairwise(points):
            if idle_s <= x1:
                return y0 + (y1 - y0) * (idle_s - x0) / (x1 - x0)
        return points[-1][1]

    def step_time_s(self, tokens: int, pairs: float, seqs: int, mixed: bool = False) -> float:
        """overhead_s + s_per_token·tokens + s_per_pair·pairs + s_per_seq·seqs, plus
        mixed_step_s for a step that mixes prefill and decode."""
        return (
            self.overhead_s
            + self.s_per_token * tokens
            + self.s_per_pair * pairs
            + self.s_per_seq * seqs
            + (self.mixed_step_s if mixed else 0.0)
        )


@dataclass(frozen=True)
class EfficiencyProfile:
    """Achieved fractions of peak and fixed overheads (docs/sources.md §4, est.), plus, per model,
    step times fitted on a real engine by ``talaria calibrate`` (``fitted``: model name →
    ``StepFit``; a model without one uses the roofline)."""

    name: str = "default"
    compute_efficiency: float = 0.3
    memory_efficiency: float = 0.7
    step_overhead_s: float = 0.005
    max_num_batched_tokens: int = 8192
    block_tokens: int = 16
    fitted: Mapping[str, StepFit] = field(default_factory=dict)
    transport_forward_s: float = 0.0
    """Proxy → node time of a call before the node sees it (status read, request over HTTP);
    measured by ``talaria calibrate``; 0 for a node in the proxy's process."""
    transport_return_s: float = 0.0
    """Node → proxy time of a call's answer (the response over HTTP)."""
    coresident_interference: float = 1.0
    """α of ``DeviceShare``: a step's device time grows by α × k while k other engines of
    the node are busy. 1 = the device time-sliced between them (GPUs without MPS,
    docs/sources.md §4); ``talaria calibrate`` measures it on engines that co-reside."""
