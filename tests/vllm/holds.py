"""The scenario both real-vLLM tests of rule 5 run (test_vllm_cpu_engines.py on calls sent as
token ids, test_vllm_chat_holds.py on chat calls): batch calls streaming, an interactive call
entering once each has streamed, with no slowdown allowed."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from talaria.core.clock import Clock
from talaria.core.types import CallRequest, FirstToken
from talaria.runtime.engine import ClassStepRule
from talaria.runtime.engines.vllm import VLLMEngine


async def serve(
    engine: VLLMEngine, clock: Clock, req: CallRequest, first: asyncio.Event | None = None
) -> list[Any]:
    """The call's events on ``engine``; ``first`` is set at its first token."""
    admission = engine.try_admit(req, clock.now(), False)
    assert admission is not None
    events = []
    async for event in engine.run(admission):
        events.append(event)
        if first is not None and isinstance(event, FirstToken):
            first.set()
    return events


async def held_for_an_interactive_call(
    engine: VLLMEngine, clock: Clock, batch: Sequence[CallRequest], interactive: CallRequest
) -> tuple[int, list[Any], list[list[Any]]]:
    """With rule 5 at ``class_slowdown`` 1.0 (every lower-class call held), the ``batch``
    calls start, and once each has streamed its first token ``interactive`` runs: the
    engine's preemptions meanwhile, the interactive call's events and each batch call's."""
    before = engine.preemptions
    engine.step_by_class(ClassStepRule(class_slowdown=1.0, preempt_limit=3))
    try:
        started = [asyncio.Event() for _ in batch]
        tasks = [
            asyncio.create_task(serve(engine, clock, req, event))
            for req, event in zip(batch, started, strict=True)
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), timeout=120)
        ide_events = await asyncio.wait_for(serve(engine, clock, interactive), timeout=120)
        bulk_events = await asyncio.wait_for(asyncio.gather(*tasks), timeout=240)
    finally:
        engine.step_by_class(None)
    return engine.preemptions - before, ide_events, list(bulk_events)
