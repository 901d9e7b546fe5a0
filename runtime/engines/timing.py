"""Timing of the engines that serve calls elsewhere (vLLM's ``AsyncLLM``, an upstream server):
the linear rate model their estimates use until a calibration replaces it (``RateModel``),
and the seconds during which they were busy (``BusyMeter``). Shared by vllm/ and upstream/."""

from __future__ import annotations

from dataclasses import dataclass

from talaria.core.clock import Clock


@dataclass(frozen=True)
class RateModel:
    """Per-token timing of one engine, for ``estimate_service_s`` (SP budgets), the switch and
    restore estimates in status, and routing. Linear on purpose; the defaults are rough figures
    for the tiny models on a 2-core CPU (a 300-token prefill ≈ 30 ms, a decode step ≈ 4-6 ms)
    and are to be replaced by measured values per model and node (`talaria calibrate`).

    - service = uncached prompt tokens × ``prefill_s_per_token``
      (+ restored tokens × ``kv_restore_s_per_token`` when the prefix comes from host)
      + expected output tokens × (``decode_step_s`` + running calls × ``decode_step_s_per_seq``);
    - switch in = ``wake_s`` (weights + KV pool) or, once staged, ``kv_wake_s``; 0 on the CPU
      path (a gate).
    """

    prefill_s_per_token: float = 1e-4
    decode_step_s: float = 5e-3
    decode_step_s_per_seq: float = 2e-4
    wake_s: float = 0.0
    kv_wake_s: float = 0.0
    kv_restore_s_per_token: float = 0.0

    def decode_step(self, batch: int) -> float:
        """One decode step of ``batch`` sequences: ``decode_step_s + (batch − 1) ×
        decode_step_s_per_seq``."""
        return self.decode_step_s + max(0, batch - 1) * self.decode_step_s_per_seq

    def restore_s(self, tokens: int) -> float:
        """``tokens × kv_restore_s_per_token``: their KV brought back from a host tier."""
        return tokens * self.kv_restore_s_per_token

    def prefill_s(self, tokens: int) -> float:
        """``tokens × prefill_s_per_token``: their prefill (again)."""
        return tokens * self.prefill_s_per_token


class BusyMeter:
    """Seconds during which at least one call was generating (overlapping calls count once)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._generating = 0
        self._since = 0.0
        self._done_s = 0.0

    def busy_s(self) -> float:
        """Busy seconds so far, the interval in progress included."""
        busy = self._done_s
        if self._generating:
            busy += self._clock.now() - self._since
        return busy

    def begin(self) -> None:
        """A call starts generating."""
        if self._generating == 0:
            self._since = self._clock.now()
        self._generating += 1

    def end(self) -> None:
        """A call stopped generating."""
        self._generating -= 1
        if self._generating == 0:
            self._done_s += self._clock.now() - self._since
