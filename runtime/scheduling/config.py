"""The node scheduler's settings other than its feature flags (those are in flags.py)."""

from __future__ import annotations

from dataclasses import dataclass

from talaria.core.holds import DEFAULT_MAX_HINT_GAP_S
from talaria.runtime.scheduling.hold_caps import STALE_HOLD_GAPS


@dataclass(frozen=True)
class SchedulerConfig:
    """One node scheduler's constants."""

    quantum_s: float = 60.0
    """The base slot length Q: a contended slot's deadline is its start + Q (with
    ``demand_slots``, start + Q × clamp(n × share, ½, 2): ``slots.slot_length_s``)."""
    default_output_tokens: int = 256
    """Output estimate for a session's first call (vLLM-style clients rarely cap it lower)."""
    stale_after_quanta: float = 10.0
    """A session idle for this many quanta no longer counts as expected back (demand)."""
    class_slowdown: float = 1.1
    """With ``fair_queue``: the most a lower class's calls may slow the decode steps of a
    higher class's calls running on the same engine (fairness.py ``lower_class_fits``): an
    operator's latency objective, not a fitted figure (the node TOML's ``[node]
    class_slowdown``). 1.1: half of the 1.2 × alone that issues 38 and 49 set for an
    interactive tenant's *sessions* beside a bulk one, because the step is only one of the
    terms that add up to a session's slowdown (its model's slot waits, the co-resident
    engines' share of the GPUs, KV restores: docs/results.md §11, where 1.2 left the
    sessions at 1.53 × and 1.1 at 1.29 × over 20 seeds)."""
    preempt_limit: int = 10
    """With ``fair_queue``: the most times a running lower-class call is held out of an
    engine's steps for a higher class (fairness.py rule 5; 0: never). An operator's bound on
    how often a bulk call may be paused, not a fitted figure (``[node] preempt_limit``). 10:
    an interactive session calls every few seconds, so a bulk call of a minute meets more
    than a few of its calls (3 bound in docs/results.md §11); each hold lasts one of them."""
    starvation_quanta: float = 2.0
    """With ``fair_queue``: a call that has waited this many quanta is promoted a class
    (fairness.py), so a batch call waits at most twice that behind interactive arrivals
    (``[node] starvation_quanta``)."""
    gap_quantile: float = 0.95
    """With ``learned_gaps``: a hold keeps the session's KV at least until this quantile
    of the session's learned log-normal gap (core/gaps.py ``predict``). 0.95: a hold that a
    calibrated fit's gaps outlast 5 % of the time, below the 4–14 % the mean rule's holds
    expire at on the §12 workloads of docs/results.md (an operator's target, not a fit)."""
    forget_idle_s: float = 3600.0
    """A session with no call here for this long (clock seconds), none queued or running and
    no hold, is forgotten as if it had ended (its entry, KV and fair-queue account:
    ``NodeScheduler.end_session``): the backstop for ends that never arrive (a proxy restarted
    or unreachable meanwhile, a session its book evicted). An hour: six times the proxy's
    default idle timeout (600 s) and the learned hold's cap (core/gaps.py)."""
    max_hint_gap_s: float = DEFAULT_MAX_HINT_GAP_S
    """The longest tool gap a client's hint may claim, clock seconds (a longer one counts as
    this): 240 s, core/holds.py ``DEFAULT_MAX_HINT_GAP_S`` says why."""
    stale_hold_gaps: float = STALE_HOLD_GAPS
    """A hold kept past this many mean gaps of its session yields its memory to
    another tenant's call that needs it (hold_caps.py says why 4)."""
