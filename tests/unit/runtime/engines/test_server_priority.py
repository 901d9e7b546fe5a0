"""The class a call carries to a server that schedules by priority (runtime/engines/
priorities.py): each convention's values, the gaps SGLang's preemption needs, the option
checked when the node is built, and the field in the request an upstream server gets."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from talaria.core.calls import Call
from talaria.core.clock import LoopClock
from talaria.core.types import CallRequest, Priority
from talaria.runtime.config import NodeConfigError
from talaria.runtime.engines.priorities import (
    SGLANG_PREEMPTION_THRESHOLD,
    server_priority,
    sglang_priority,
    vllm_priority,
)
from talaria.runtime.engines.upstream import build_upstream_engine, upstream_options
from tests.fake_upstream import fake_upstream

CLASSES = (Priority.INTERACTIVE, Priority.STANDARD, Priority.BATCH)


@pytest.mark.parametrize(
    ("priority", "sp_admitted", "vllm", "sglang"),
    [
        (Priority.INTERACTIVE, True, 0, 25),
        (Priority.INTERACTIVE, False, 1, 24),
        (Priority.STANDARD, True, 2, 13),
        (Priority.STANDARD, False, 3, 12),
        (Priority.BATCH, True, 4, 1),
        (Priority.BATCH, False, 5, 0),
    ],
)
def test_each_conventions_value(
    priority: Priority, sp_admitted: bool, vllm: int, sglang: int
) -> None:
    assert server_priority("vllm", priority, sp_admitted) == vllm
    assert server_priority("sglang", priority, sp_admitted) == sglang
    assert server_priority("none", priority, sp_admitted) is None


def test_sglang_preempts_across_classes_and_never_within_one() -> None:
    """A waiting request preempts a running one when its priority exceeds it by more than the
    threshold: every higher class over every lower one, no call over its own class."""
    calls = list(itertools.product(CLASSES, (True, False)))
    for (a, sp_a), (b, sp_b) in itertools.product(calls, calls):
        gap = sglang_priority(a, sp_a) - sglang_priority(b, sp_b)
        if a.rank < b.rank:
            assert gap > SGLANG_PREEMPTION_THRESHOLD
            assert vllm_priority(a, sp_a) < vllm_priority(b, sp_b)  # lower first in vLLM
        elif a is b:
            assert abs(gap) <= 1 < SGLANG_PREEMPTION_THRESHOLD


def test_the_option_is_checked_by_name() -> None:
    assert upstream_options("m", {"url": "http://h"}).priority == "none"
    assert upstream_options("m", {"url": "http://h", "priority": "sglang"}).priority == "sglang"
    with pytest.raises(NodeConfigError, match="model m: priority must be one of"):
        upstream_options("m", {"url": "http://h", "priority": "high"})


@pytest.mark.parametrize(("kind", "sent"), [("vllm", [0, 5]), ("sglang", [25, 0]), ("none", None)])
def test_an_upstream_server_gets_the_calls_class(kind: str, sent: list[int] | None) -> None:
    """An interactive call admitted on the SP budget, then a batch call: the request bodies
    carry the option's values, or no ``priority`` field at all."""

    async def main() -> list[dict[str, Any]]:
        async with fake_upstream() as fake:
            engine = build_upstream_engine(
                "fake-model", {"url": fake.url, "priority": kind}, LoopClock(), "node0"
            )
            await engine.start()
            await engine.activate()
            for rid, priority, sp in (
                ("r1", Priority.INTERACTIVE, True),
                ("r2", Priority.BATCH, False),
            ):
                call = Call("fake-model", messages=({"role": "user", "content": "hi"},))
                request = CallRequest(
                    rid, rid, "fake-model", call.prompt_tokens(), 8, call=call, priority=priority
                )
                admission = engine.try_admit(request, 0.0, sp)
                assert admission is not None
                assert [e async for e in engine.run(admission)]
            await engine.shutdown()
            return fake.bodies

    bodies = asyncio.run(main())
    if sent is None:
        assert all("priority" not in b for b in bodies)
    else:
        assert [b["priority"] for b in bodies] == sent
