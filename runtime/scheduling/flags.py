"""Scheduler feature flags and the named policies built from them.

Every ablation is the same scheduler with flags switched (DESIGN.md, "Rules"): ``round`` has all
four off, ``talaria`` all on, and ``+<flag>`` switches on one flag over ``round``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class SchedulerFlags:
    sp_admission: bool = False
    """Admit a continuation of the active model mid-slot when it fits the slot's budget."""
    host_kv: bool = False
    """At a switch, move the outgoing model's session KV to host DRAM instead of dropping it."""
    d2d_staging: bool = False
    """Prefetch the next model's weights into free HBM during a slot; switch by device copy."""
    soft_reservations: bool = False
    """A session in a tool gap holds admission budget and its KV until it returns or expires."""

    def enabled(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name)]


FLAG_NAMES: tuple[str, ...] = tuple(f.name for f in fields(SchedulerFlags))
ROUND = SchedulerFlags()
TALARIA = SchedulerFlags(True, True, True, True)


def policy_flags(name: str) -> SchedulerFlags:
    """``round``, ``talaria``, or ``+flag`` (one flag over round), e.g. ``+sp_admission``."""
    if name == "round":
        return ROUND
    if name == "talaria":
        return TALARIA
    if name.startswith("+") and name[1:] in FLAG_NAMES:
        return replace(ROUND, **{name[1:]: True})
    choices = ", ".join(["round", "talaria", *(f"+{f}" for f in FLAG_NAMES)])
    raise ValueError(f"unknown policy {name!r}; choose from: {choices}")


DEFAULT_POLICIES: tuple[str, ...] = ("round", *(f"+{f}" for f in FLAG_NAMES), "talaria")
