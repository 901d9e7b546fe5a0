"""A call's way into and out of one node: ``NodeCalls`` lets it in (``enter``: refused when the
node does not host its model, ``UnknownModelError``, or its loop has ended, ``NodeStopped``;
its session told, ``SessionLifecycle.arrived``; queued with the future of its result), and
hands out its result (``submit``) or its events (``stream``); a consumer that leaves a stream
early takes the call out of its queue or, admitted already, cancels its generation.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any

from talaria.core.types import CallRequest, CallResult, Finished, GenerationEvent
from talaria.runtime.scheduling.intake import Intake
from talaria.runtime.scheduling.lifecycle import SessionLifecycle
from talaria.runtime.scheduling.state import NodeContext, WaitingCall


class UnknownModelError(LookupError):
    """The node does not host the requested model."""


class NodeStopped(RuntimeError):
    """The node's scheduling loop has ended (it raised, or returned): the node serves no call
    (``NodeScheduler.failure`` says why)."""


async def _next_event(
    events: asyncio.Queue[GenerationEvent], done: asyncio.Future[Any]
) -> GenerationEvent | None:
    """The next queued event, or None once ``done`` resolves with nothing left queued."""
    while True:
        if not events.empty():
            return events.get_nowait()
        if done.done():
            return None
        getter = asyncio.ensure_future(events.get())
        try:
            await asyncio.wait([getter, done], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()


class NodeCalls:
    """The node's calls as their callers see them (the module docstring); ``failure``: why
    the node's loop ended, or None while it runs (``NodeScheduler.failure``)."""

    def __init__(
        self,
        context: NodeContext,
        intake: Intake,
        lifecycle: SessionLifecycle,
        failure: Callable[[], str | None],
    ) -> None:
        self._context = context
        self._intake = intake
        self._lifecycle = lifecycle
        self._failure = failure

    async def submit(self, request: CallRequest) -> CallResult:
        """Queue the call and wait for its result."""
        return await self.enter(request, None).result

    async def stream(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        """Queue the call and yield its events (``FirstToken``, ``TokenDelta``s for streaming
        requests, ``Finished``). If the consumer stops before the call ends, the call leaves
        the queue, or, admitted already, its generation is cancelled (the engine aborts it and
        frees what it holds: a client that went away does not keep the engine busy)."""
        events: asyncio.Queue[GenerationEvent] = asyncio.Queue()
        waiting = self.enter(request, events)
        try:
            while True:
                event = await _next_event(events, waiting.result)
                if event is None:  # the call ended without a Finished event: it failed
                    error = waiting.result.exception()
                    if error is not None:
                        raise error
                    return
                yield event
                if isinstance(event, Finished):
                    return
        finally:
            if self._intake.withdraw(waiting):
                waiting.result.cancel()
                self._context.signals.poke()
            elif waiting.serving is not None and not waiting.result.done():
                self._intake.abandon(waiting.serving)

    def enter(
        self, request: CallRequest, events: asyncio.Queue[GenerationEvent] | None
    ) -> WaitingCall:
        """Let the call in (the module docstring): its session told, it joins its model's
        queue, its result a future whose end settles the call for its session."""
        if request.model not in self._context.engines:
            raise UnknownModelError(
                f"node {self._context.name} does not host model {request.model!r}"
            )
        failure = self._failure()
        if failure is not None:
            raise NodeStopped(failure)
        now = self._context.clock.now()
        self._lifecycle.arrived(request, now)
        fut: asyncio.Future[CallResult] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(lambda _: self._lifecycle.settled(request.session_key))
        waiting = WaitingCall(request, now, fut, events)
        self._intake.enqueue(waiting)
        self._context.signals.poke()
        return waiting
