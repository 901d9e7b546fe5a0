"""What an engine that serves its calls elsewhere (vLLM's ``AsyncLLM``, an upstream server) keeps
of its own, shared by vllm/ and upstream/ (``ServingState``): whether it admits calls, the calls
admitted and not yet finished, the seconds some call was generating, the switches so far; and
the read-outs of it both engines give (``ServedEngine``)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from talaria.core.clock import Clock
from talaria.core.types import CallRequest, GenerationEvent, KvSource
from talaria.runtime.engine import Admission
from talaria.runtime.engines.timing import BusyMeter


class ServingState:
    """One engine's admission gate and call count: ``open`` (its ``activate``) and ``close``
    (its ``deactivate``, once drained), ``admit`` (only while open), ``serve`` (the call
    counts as running until its events end)."""

    def __init__(self, model: str, clock: Clock) -> None:
        self.model = model
        self._clock = clock
        self.active = False
        """Open for admission."""
        self.running = 0
        """Calls admitted and not yet finished."""
        self.switches = 0
        """Times opened so far."""
        self.busy = BusyMeter(clock)
        """Seconds during which some call was generating (the engine's generation meters it)."""

    def admit(
        self,
        request: CallRequest,
        arrival_s: float,
        sp_admitted: bool,
        source: KvSource,
        cached_tokens: int,
    ) -> Admission:
        """The call admitted now, with the KV the engine predicts for it, counted running; a
        ``RuntimeError`` while closed (the node asks only while open)."""
        if not self.active:
            raise RuntimeError(f"engine {self.model} is not active")
        self.running += 1
        return Admission(request, arrival_s, self._clock.now(), sp_admitted, source, cached_tokens)

    async def serve(
        self, events: AsyncGenerator[GenerationEvent, None]
    ) -> AsyncIterator[GenerationEvent]:
        """An admitted call's ``events``; it counts as running until they end, however they
        end (closed early, they are closed)."""
        try:
            async for event in events:
                yield event
        finally:
            self.running -= 1
            await events.aclose()

    def open(self) -> None:
        """Open for admission (a switch in)."""
        self.active = True
        self.switches += 1

    def close(self) -> None:
        """Close for admission (a switch out): only once drained, else a ``RuntimeError``."""
        if self.running:
            raise RuntimeError(f"deactivating {self.model} with {self.running} calls running")
        self.active = False


class ServedEngine:
    """The read-outs of an engine that keeps a ``ServingState`` (``_state``): the vLLM and
    upstream engines inherit them."""

    _state: ServingState

    @property
    def active(self) -> bool:
        """Open for admission (``activate``)."""
        return self._state.active

    @property
    def running(self) -> int:
        """Calls admitted and not yet finished."""
        return self._state.running

    @property
    def switches(self) -> int:
        """Activations so far."""
        return self._state.switches

    @property
    def busy_s(self) -> float:
        """Seconds during which some call was generating."""
        return self._state.busy.busy_s()
