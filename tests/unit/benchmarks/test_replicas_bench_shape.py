"""bench/replicas_live.py's sessions wait ``gap_s`` of tool time between calls, and ``idle_s``
instead after every ``idle_every``-th call (the gaps that expire a sticky balancer's entry)."""

from __future__ import annotations

import pytest

from bench.replicas_live import Shape


@pytest.mark.parametrize(
    ("idle_every", "expected"),
    [
        (0, [0.0, 0.5, 0.5, 0.5, 0.5, 0.5]),  # never idle
        (2, [0.0, 0.5, 9.0, 0.5, 9.0, 0.5]),  # before calls 2 and 4
        (3, [0.0, 0.5, 0.5, 9.0, 0.5, 0.5]),
        (1, [0.0, 9.0, 9.0, 9.0, 9.0, 9.0]),  # every gap idle
    ],
)
def test_the_wait_before_each_call(idle_every: int, expected: list[float]) -> None:
    shape = Shape(
        sessions=1, turns=6, gap_s=0.5, system_kb=1, task_lines=1, tool_lines=1,
        idle_s=9.0, idle_every=idle_every,
    )  # fmt: skip
    assert [shape.gap_before(turn) for turn in range(6)] == expected
