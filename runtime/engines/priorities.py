"""The priority an engine's server gets for a call, in its own convention.

- **vLLM** (its ``priority`` field; the engine started with ``--scheduling-policy priority``,
  else vLLM 0.32 ignores it, docs/sources.md §13): lower runs first.
  ``vllm_priority = 2 · rank + (0 if SP-admitted else 1)`` (rank: interactive 0, standard 1,
  batch 2), so when vLLM must choose (its waiting queue, and the running request it preempts
  when KV runs out: the largest value first) a lower class yields first, and within a class
  the SP-admitted call runs first.
- **SGLang** (its ``priority`` field; the server started with ``--enable-priority-scheduling``,
  docs/sources.md §13): higher runs first by default, and a waiting request preempts running
  ones only when its priority exceeds theirs by more than ``--priority-scheduling-preemption-
  threshold`` (10 by default). ``sglang_priority = (2 − rank) · (threshold + 2) + (1 if
  SP-admitted else 0)``: classes 12 apart, so the lowest of a class still exceeds the highest
  of the class below by 11 > 10 (a higher class preempts a lower one), and within a class the
  two values differ by 1 (never a preemption).
"""

from __future__ import annotations

from typing import Literal

from talaria.core.types import PRIORITY_RANKS, Priority

ServerPriority = Literal["none", "vllm", "sglang"]
SERVER_PRIORITIES: tuple[ServerPriority, ...] = ("none", "vllm", "sglang")

PRIORITY_SP = 0
"""Within a class, the vLLM priority offset of an SP-admitted call (lower runs first under
``scheduling_policy="priority"``): it was admitted on a time budget that ends at the slot
deadline."""
PRIORITY_DEFAULT = 1
SGLANG_PREEMPTION_THRESHOLD = 10
"""SGLang's default ``--priority-scheduling-preemption-threshold`` (docs/sources.md §13)."""
LOWEST_RANK = max(PRIORITY_RANKS.values())


def vllm_priority(priority: Priority, sp_admitted: bool) -> int:
    """vLLM's priority for a call (module docstring)."""
    return 2 * priority.rank + (PRIORITY_SP if sp_admitted else PRIORITY_DEFAULT)


def sglang_priority(priority: Priority, sp_admitted: bool) -> int:
    """SGLang's priority for a call, higher first (module docstring)."""
    step = SGLANG_PREEMPTION_THRESHOLD + 2
    return (LOWEST_RANK - priority.rank) * step + (1 if sp_admitted else 0)


def server_priority(kind: ServerPriority, priority: Priority, sp_admitted: bool) -> int | None:
    """The ``priority`` field a server of ``kind`` gets for a call; None for ``none`` (the
    field is not sent)."""
    if kind == "vllm":
        return vllm_priority(priority, sp_admitted)
    if kind == "sglang":
        return sglang_priority(priority, sp_admitted)
    return None
