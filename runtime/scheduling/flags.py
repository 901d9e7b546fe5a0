"""Scheduler feature flags and the named policies built from them.

Every ablation is the same scheduler with flags switched: ``round`` has all of them off,
``talaria`` all on but ``learned_gaps`` (``talaria-learned``: all on), ``+<flag>`` switches on
one flag over ``round`` and ``-<flag>`` switches one off from ``talaria`` (several at once:
``+a+b``, ``-a-b``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class SchedulerFlags:
    """Which of the scheduler's features are on (all off: ``round``; all on: ``talaria``)."""

    sp_admission: bool = False
    """Admit a continuation of the active model mid-slot when it fits the slot's budget."""
    host_kv: bool = False
    """At a switch, move the outgoing model's session KV to host DRAM instead of dropping it."""
    d2d_staging: bool = False
    """Prefetch the next model's weights into free HBM during a slot; switch by device copy."""
    soft_reservations: bool = False
    """A session in a tool gap holds admission budget and its KV until it returns or expires
    (a hold: holds.py; the flag keeps its name, as do the policy names that say it)."""
    demand_slots: bool = False
    """Pick the next slot's model, and size its slot, from queued and expected work
    (``slots.next_model_by_demand``, ``slots.slot_length_s``) instead of round-robin with a
    fixed quantum."""
    co_residency: bool = False
    """Keep every model whose weights fit beside the slot's model resident and serving at the
    same time (``slots.resident_set``); only the models that do not fit are switched."""
    fair_queue: bool = False
    """Admit waiting calls by class, then tenant shares of the node's service, then least
    attained service per session (fairness.py), instead of in arrival order; weigh each
    model's demand for slots by the tenants' shares."""
    learned_gaps: bool = False
    """With ``soft_reservations``: a session without a gap hint holds its KV to a quantile of
    its learned log-normal tool gap (core/gaps.py), not only to the mean rule's slack. Per
    population (tenant, model, agent kind) an online fit of ln(gap) (Welford, seeded with
    docs/sources.md §2's mixture: μ0 = −0.7374, σ0 = 1.5589, as 20 observations); per session
    μ_s = (3 μ_pop + Σ ln g) / (3 + n), σ the population's. Whether to hold and how long the
    hold keeps the slot open and a budget for the next call stay the mean rule's
    (core/holds.py); the KV is held until now + max(min(e^(μ_s + z_q σ), 600 s),
    e^μ_s + 1 s, the mean rule's hold), q = ``SchedulerConfig.gap_quantile`` (0.95). A hint
    still uses the mean rule alone. Not in ``talaria`` (the named policy ``talaria-learned`` is
    ``talaria`` with it on), and not among the ``+flag`` ablations of ``DEFAULT_POLICIES``."""

    serverless_instances: bool = False
    """Request-level instances, as a serverless platform runs them (ServerlessLLM's model):
    the model of the oldest waiting call gets the node's GPUs next, keeps them until it has
    had no call for a fixed keep-alive (``SERVERLESS_KEEP_ALIVE_S``, no quantum), and admits
    every call of it meanwhile, session or not. The named policy ``serverless``; not in
    ``talaria``."""

    def enabled(self) -> list[str]:
        """The names of the flags that are on, in declaration order."""
        return [f.name for f in fields(self) if getattr(self, f.name)]


FLAG_NAMES: tuple[str, ...] = tuple(f.name for f in fields(SchedulerFlags))
ROUND = SchedulerFlags()
TALARIA = SchedulerFlags(True, True, True, True, True, True, True)
TALARIA_LEARNED = replace(TALARIA, learned_gaps=True)
"""``talaria`` with ``learned_gaps`` (the named policy ``talaria-learned``)."""
SERVERLESS = SchedulerFlags(serverless_instances=True)
"""The named policy ``serverless``: request-level instances, every Talaria feature off."""
ABLATION_FLAGS: tuple[str, ...] = tuple(f for f in FLAG_NAMES if getattr(TALARIA, f))
"""The flags ``talaria`` has on, whose ``+flag`` policies are the default ablations."""


def policy_flags(name: str) -> SchedulerFlags:
    """``round``, ``talaria``, ``+flag`` (flags over round, e.g. ``+sp_admission`` or
    ``+sp_admission+host_kv``) or ``-flag`` (talaria with flags off, e.g. ``-co_residency`` or
    ``-co_residency-demand_slots``: the four original flags), or ``talaria-learned``."""
    if name == "round":
        return ROUND
    if name == "talaria":
        return TALARIA
    if name == "talaria-learned":
        return TALARIA_LEARNED
    if name == "serverless":
        return SERVERLESS
    sign = name[:1]
    names = name[1:].split(sign) if sign in ("+", "-") else []
    if names and all(f in FLAG_NAMES for f in names):
        base, on = (ROUND, True) if sign == "+" else (TALARIA, False)
        return replace(base, **dict.fromkeys(names, on))
    choices = ", ".join(
        [
            "round",
            "talaria",
            "talaria-learned",
            "serverless",
            *(f"+{f}" for f in FLAG_NAMES),
            *(f"-{f}" for f in FLAG_NAMES),
        ]
    )
    raise ValueError(f"unknown policy {name!r}; choose from: {choices} (several flags: +a+b, -a-b)")


DEFAULT_POLICIES: tuple[str, ...] = ("round", *(f"+{f}" for f in ABLATION_FLAGS), "talaria")
