"""What bounds the fair queue's figures (issue 49, round four; docs/results.md §11): the same
measurement as bench/fairness.py, with parts of the fair order turned back to the plain
queue's, or with an order no node could have.

    .venv/bin/python bench/fairness_bounds.py --revert slots --preset noisy --seeds 5
    .venv/bin/python bench/fairness_bounds.py --revert slots --preset noisy --seeds 5 \\
        --class-slowdown 100 --preempt-limit 0        # the step rules off too
    .venv/bin/python bench/fairness_bounds.py --revert slots --revert kv --preset noisy \\
        --class-slowdown 100 --preempt-limit 0
    .venv/bin/python bench/fairness_bounds.py --oracle --preset saturated --seeds 5
    .venv/bin/python bench/fairness_bounds.py --calls-left --preset saturated

``--revert`` (repeatable) gives ``FairOrder`` the plain ``QueueOrder``'s hooks for a group of
its rules (runtime/scheduling/policies/queue.py): ``slots`` — ``first_choices``,
``closes_slot``, ``weighed_work`` (the slot rules); ``kv`` — ``evicts_by_class`` and
``counted_holds``. The step rules (4 and 5) are bench/fairness.py's own options
(``--class-slowdown 100 --preempt-limit 0``). ``--oracle`` orders each tenant's sessions by
their *true* calls left (the trace's, which a node never knows): shortest remaining first, the
bound on what any session order could do. ``--calls-left`` prints, for the preset's session
lengths (sim/workload.py ``draw_num_calls``, 2 million draws), the expected calls left of a
session that has made k: what a node could estimate from a session's history. Every other
option is bench/fairness.py's; the changes live in this process only.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import fairness
from talaria.core.trace import SessionTrace
from talaria.runtime.scheduling.fairness import ServiceAccounts
from talaria.runtime.scheduling.policies.queue import FairOrder, QueueOrder
from talaria.sim.presets import get_preset
from talaria.sim.workload import draw_num_calls

GROUPS = {
    "slots": ("first_choices", "closes_slot", "weighed_work"),
    "kv": ("evicts_by_class", "counted_holds"),
}
ORACLE_WEIGHT = 1e6
"""Seconds of "attained service" per call left: far above any wait, so the order is by calls
left alone (fairness.py rule 3's key is attained − waited)."""


def revert(group: str) -> None:
    """``FairOrder`` takes ``QueueOrder``'s hooks of ``group``."""
    for name in GROUPS[group]:
        setattr(FairOrder, name, getattr(QueueOrder, name))


class CallsLeft(dict[str, float]):
    """``ServiceAccounts.attained`` for the oracle: a session's key is its true calls left ×
    ``ORACLE_WEIGHT``, whatever it has been served."""

    total: ClassVar[dict[str, int]] = {}
    done: ClassVar[dict[str, int]] = {}

    def get(self, key: str, default: Any = None) -> float:  # type: ignore[override]
        return (self.total.get(key, 0) - self.done.get(key, 0)) * ORACLE_WEIGHT


def use_oracle() -> None:
    """Every node's accounts order sessions by ``CallsLeft``; each replay's sessions set it."""
    init, ended, replay = ServiceAccounts.__init__, ServiceAccounts.call_ended, fairness._replay

    def accounts_init(self: ServiceAccounts, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.attained = CallsLeft()
        CallsLeft.done.clear()  # one node per replay, replays one after another

    def call_ended(
        self: ServiceAccounts, request: Any, estimate_s: float, measured_s: float
    ) -> None:
        ended(self, request, estimate_s, measured_s)
        CallsLeft.done[request.session_key] = CallsLeft.done.get(request.session_key, 0) + 1

    def replay_with_lengths(sessions: list[SessionTrace], *args: Any) -> dict[str, Any]:
        CallsLeft.total = {s.session_id: s.num_calls for s in sessions}
        return replay(sessions, *args)

    ServiceAccounts.__init__ = accounts_init  # type: ignore[method-assign]
    ServiceAccounts.call_ended = call_ended  # type: ignore[method-assign]
    fairness._replay = replay_with_lengths


def calls_left(preset: str, draws: int = 2_000_000) -> dict[int, float]:
    """Per k calls made, the mean calls left of the preset's sessions longer than k."""
    spec = get_preset(preset).workload
    rng = random.Random(0)
    lengths = [draw_num_calls(rng, spec) for _ in range(draws)]
    out = {}
    for k in (0, 4, 8, 16, 32, 64):
        longer = [n - k for n in lengths if n > k]
        out[k] = sum(longer) / len(longer)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Other options: bench/fairness.py --help."
    )
    parser.add_argument("--revert", action="append", choices=sorted(GROUPS), default=[])
    parser.add_argument("--oracle", action="store_true", help="order by true calls left")
    parser.add_argument(
        "--calls-left", action="store_true", help="expected calls left after k (no replay)"
    )
    args, rest = parser.parse_known_args()
    if args.calls_left:
        preset = rest[rest.index("--preset") + 1] if "--preset" in rest else "saturated"
        print({k: round(v, 1) for k, v in calls_left(preset).items()})
        return
    for group in args.revert:
        revert(group)
    if args.oracle:
        use_oracle()
    sys.argv = [sys.argv[0], *rest]
    fairness.main()


if __name__ == "__main__":
    main()
