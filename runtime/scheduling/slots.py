"""Slot policy: which model a node serves next, which models stay resident beside it, how
long its slot lasts, and when the slot closes. Pure.

- Order (round-robin, ``next_model``): models take turns in their configured order, starting
  after the active one; a model with no waiting call is skipped; the active model comes last,
  so it keeps the node (a renewed slot, no switch) when only it has waiting calls.
- Order (``demand_slots``, ``next_model_by_demand``): the model with the most work waiting and
  expected, weighted by its wait, with a stated starvation bound; its slot's length follows its
  share of the demand (``slot_length_s``).
- Residents (``co_residency``, ``resident_set``): the slot's model plus the others that fit
  beside it, by demand.
- A slot has a deadline only while it is *contended*, i.e. a model that is not resident has a
  waiting call.
  Uncontended, the resident models run as plain continuous batching, in every policy.
- A contended slot closes when its quantum has elapsed (``QUANTUM``), or earlier when it has
  nothing left to do (``IDLE``): no call running, no waiting call it may admit, and no live
  hold expected back before the deadline.
- At the close no call is preempted: admission stops and the running calls drain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum


class CloseReason(StrEnum):
    """Why a contended slot closed: its deadline passed, it had nothing left to do, or (with
    ``fair_queue``) a call of a higher class than any it serves waits for another model."""

    QUANTUM = "quantum"
    IDLE = "idle"
    OUTRANKED = "outranked"


def next_model(order: Sequence[str], active: str | None, waiting: Mapping[str, int]) -> str | None:
    """The first model after ``active`` in ``order`` (wrapping, ``active`` last) with waiting
    calls, or None when no model has any."""
    if not order:
        return None
    start = order.index(active) + 1 if active in order else 0
    for i in range(len(order)):
        model = order[(start + i) % len(order)]
        if waiting.get(model, 0) > 0:
            return model
    return None


def close_reason(
    *,
    now_s: float,
    deadline_s: float,
    contended: bool,
    running: int,
    admissible_waiting: bool,
    live_holds: int,
) -> CloseReason | None:
    """Why the active slot closes now, or None to keep it open (rules in the module doc)."""
    if not contended:
        return None
    if now_s >= deadline_s:
        return CloseReason.QUANTUM
    if running == 0 and not admissible_waiting and live_holds == 0:
        return CloseReason.IDLE
    return None


@dataclass(frozen=True)
class Demand:
    """One model's work on a node, as the slot policy sees it."""

    waiting: int
    """Calls queued for the model."""
    expected_back: int = 0
    """Sessions of the model in a tool gap, expected back within the coming quantum."""
    oldest_wait_s: float = 0.0
    """How long the model's oldest queued call has waited (0 with none queued)."""
    shared_work: float | None = None
    """With ``fair_queue``: the model's work weighed by the tenants' shares
    (:func:`shared_work`), in place of ``waiting + expected_back``."""

    @property
    def work(self) -> float:
        """What the slot would serve: ``shared_work``, else ``waiting + expected_back``."""
        if self.shared_work is not None:
            return self.shared_work
        return self.waiting + self.expected_back


def shared_work(
    work: Mapping[str, Mapping[str, int]], weights: Mapping[str, float]
) -> dict[str, float]:
    """Per model, its work weighed by the tenants' shares: ``Σ_t N · w_t / W · n_{t,m} / n_t``,
    ``work[t][m] = n_{t,m}`` (tenant ``t``'s calls waiting and sessions expected back on model
    ``m``), ``n_t`` their sum over models, ``w_t`` its weight, ``W`` the sum of the weights of
    the tenants with work, ``N`` all the work. Each tenant brings its share of the node's work
    spread over its models, so a burst of one tenant on one model counts as that tenant's
    share, not as its number of calls; with one tenant it is the plain count."""
    total = sum(sum(per_model.values()) for per_model in work.values())
    weight_sum = sum(weights[t] for t, per_model in work.items() if sum(per_model.values()))
    out: dict[str, float] = {}
    for tenant, per_model in work.items():
        n_t = sum(per_model.values())
        if n_t == 0:
            continue
        share = total * weights[tenant] / weight_sum
        for model, n in per_model.items():
            out[model] = out.get(model, 0.0) + share * n / n_t
    return out


@dataclass(frozen=True)
class DemandPolicy:
    """The demand-aware slot policy's constants, in units of the base quantum ``Q``.

    - ``starvation_s`` (S): a model whose oldest queued call has waited S is *starving*.
    - slot lengths lie in [``min_factor`` × Q, ``max_factor`` × Q].
    """

    quantum_s: float
    starvation_factor: float = 2.0
    min_factor: float = 0.5
    max_factor: float = 2.0

    @property
    def starvation_s(self) -> float:
        """S = starvation_factor × Q."""
        return self.starvation_factor * self.quantum_s

    @property
    def max_slot_s(self) -> float:
        """Qmax = max_factor × Q, the longest slot."""
        return self.max_factor * self.quantum_s


def best_class(ranks: Sequence[int]) -> int | None:
    """The best (lowest) class rank among ``ranks``; None for none."""
    return min(ranks, default=None)


def outranked(
    waiting_outside: int | None, serving: int | None, elapsed_s: float, min_slot_s: float
) -> bool:
    """With ``fair_queue``: whether the slot should close for a higher class. It should when a
    call of class ``waiting_outside`` (the best waiting for a model outside the resident set)
    outranks every call the slot serves (``serving``: the best class running or waiting on
    its models; None: nothing) and the slot has run ``min_slot_s`` (half a quantum), so a
    higher class waits at most that plus a switch for its model."""
    if waiting_outside is None or elapsed_s < min_slot_s:
        return False
    return serving is None or waiting_outside < serving


def demand_score(demand: Demand, quantum_s: float) -> float:
    """score = work × (1 + oldest_wait_s / Q) (``Demand.work``: waiting + expected back, or
    with ``fair_queue`` that weighed by the tenants' shares): the work a slot would serve,
    weighted up by how long it has waited (in quanta)."""
    return demand.work * (1.0 + demand.oldest_wait_s / quantum_s)


def _turn_rank(order: Sequence[str], active: str | None) -> dict[str, int]:
    """Round-robin position after ``active`` (the active model ranks last)."""
    start = order.index(active) + 1 if active in order else 0
    return {order[(start + i) % len(order)]: i for i in range(len(order))}


def next_model_by_demand(
    order: Sequence[str],
    active: str | None,
    demands: Mapping[str, Demand],
    policy: DemandPolicy,
) -> str | None:
    """The model whose slot comes next, from demand. Only models with queued calls are
    eligible (None when none has any: work conservation is the caller's uncontended mode).

    - If any eligible model is starving (oldest wait ≥ S), the one that has waited longest.
    - Else the highest ``demand_score``; ties go to the round-robin order after ``active``.

    Starvation bound: a slot lasts at most ``max_slot_s`` (Qmax) plus the drain D of the
    calls running at its close, and a switch W. Once a model's oldest call has waited S, only
    models that have waited even longer go first, each at most once, so with M models that
    call's model gets a slot within S + (M − 1) × (Qmax + D + W) of the call's arrival
    (assuming a slot admits its queued batch whole, i.e. memory permitting).
    """
    eligible = [m for m in order if demands.get(m, Demand(0)).waiting > 0]
    if not eligible:
        return None
    rank = _turn_rank(order, active)
    starving = [m for m in eligible if demands[m].oldest_wait_s >= policy.starvation_s]
    if starving:
        return max(starving, key=lambda m: (demands[m].oldest_wait_s, -rank[m]))
    return max(eligible, key=lambda m: (demand_score(demands[m], policy.quantum_s), -rank[m]))


def slot_length_s(model: str, demands: Mapping[str, Demand], policy: DemandPolicy) -> float:
    """Q × clamp(n × score_m / Σ scores, min_factor, max_factor) over the n models with work
    (queued or expected back): a model with k× the mean demand gets k× the base quantum,
    within bounds. With no other model in demand it gets Q."""
    q = policy.quantum_s
    scores = {
        m: demand_score(d, q) for m, d in demands.items() if d.waiting > 0 or d.expected_back > 0
    }
    total = sum(scores.values())
    if model not in scores or total <= 0 or len(scores) < 2:
        return q
    factor = len(scores) * scores[model] / total
    return q * min(policy.max_factor, max(policy.min_factor, factor))


def resident_set(
    first: str,
    current: Sequence[str],
    demands: Mapping[str, Demand],
    weight_bytes: Mapping[str, float],
    kv_floor_bytes: Mapping[str, float],
    capacity_bytes: float,
    quantum_s: float,
) -> list[str]:
    """The models resident together in the next slot: ``first`` (whose turn it is), then the
    others greedily while Σ weights + max KV floor ≤ capacity. Candidates are the models with
    demand (by ``demand_score``, descending) and then the currently resident ones (keeping a
    resident model costs no switch); ties keep the current residents first, then the order of
    ``weight_bytes``. ``kv_floor_bytes[m]``: the least KV room the model must keep (one
    longest sequence: vLLM refuses to start with less, docs/sources.md §4)."""
    names = list(weight_bytes)

    def key(m: str) -> tuple[float, int, int]:
        d = demands.get(m, Demand(0))
        return (-demand_score(d, quantum_s), m not in current, names.index(m))

    chosen = [first]
    for model in sorted((m for m in names if m != first), key=key):
        d = demands.get(model, Demand(0))
        if model not in current and d.waiting == 0 and d.expected_back == 0:
            continue
        trial = [*chosen, model]
        need = sum(weight_bytes[m] for m in trial) + max(kv_floor_bytes[m] for m in trial)
        if need <= capacity_bytes:
            chosen = trial
    return chosen
