"""``InstantRuntime``: a runtime that answers every call at once (the proxy's ``RuntimeClient``
seam, structurally), writing the simulated engine's placeholder words.

No engine, no scheduler, no sleeping: ``generate`` yields ``FirstToken``, then (for streaming
calls) one ``TokenDelta`` per further token, then ``Finished``, all at the loop clock's "now". It
exists to measure what the proxy itself costs (``bench/proxy_overhead.py``) and to test the API
layer without the simulated engine's timing.

Prefix reuse is modelled like the simulated engine, minus memory: the first call of a session is
``KvSource.NEW`` with nothing cached; every later call is ``KvSource.HBM`` with the shared prefix
(``CallRequest.shared_prefix_tokens``, or the previous prompt + output when ``None``) floored to
whole ``block_tokens`` blocks, and never the last prompt token.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncGenerator, Mapping, Sequence

from talaria.core.calls import FinishReason, ModelOutput, OutputDelta
from talaria.core.clock import Clock, LoopClock
from talaria.core.status import InstanceStatus, ModelResidency, ModelState
from talaria.core.types import (
    CallRequest,
    Finished,
    FirstToken,
    GenerationEvent,
    KvSource,
    TokenDelta,
)
from talaria.runtime.engine import Admission, call_result
from talaria.runtime.engines.sim_reply import words


class InstantRuntime:
    """Every model of ``models`` always ACTIVE; every reply ``min(max_output_tokens,
    output_tokens)`` placeholder words (one per token, as the simulated engine writes them),
    generated instantly.

    Sessions it has served are remembered (least recently used forgotten beyond
    ``max_sessions``) so continuations report cached tokens; ``end_sessions`` and a call with
    ``session_final`` forget them.
    """

    kind = "instant"
    address: str | None = None

    def __init__(
        self,
        models: Sequence[str] = ("bench-model",),
        *,
        name: str = "instant-0",
        output_tokens: int = 16,
        block_tokens: int = 16,
        clock: Clock | None = None,
        max_sessions: int = 100_000,
    ) -> None:
        if not models:
            raise ValueError("InstantRuntime needs at least one model")
        if output_tokens < 1 or block_tokens < 1:
            raise ValueError("output_tokens and block_tokens must be positive")
        self.name = name
        self._models = tuple(models)
        self._output_tokens = output_tokens
        self._block = block_tokens
        self._clock: Clock = clock or LoopClock()
        self._max_sessions = max_sessions
        self._sessions: OrderedDict[str, int] = OrderedDict()
        """session → tokens of its context after its last call (prompt + output)."""
        self._status = InstanceStatus(
            instance=name,
            at_s=0.0,
            active_model=self._models[0],
            models={
                m: ModelResidency(model=m, state=ModelState.ACTIVE, next_slot_in_s=0.0)
                for m in self._models
            },
        )
        self.calls = 0
        """Calls served (started) so far."""

    @property
    def models(self) -> tuple[str, ...]:
        return self._models

    @property
    def context_windows(self) -> Mapping[str, int]:
        """None reported: the catalog's, if any, apply."""
        return {}

    @property
    def draining_models(self) -> frozenset[str]:
        """None: its models are fixed."""
        return frozenset()

    async def start(self) -> None:
        return None

    def generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        return self._generate(request)

    async def _generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:
        self.calls += 1
        now = self._clock.now()
        tokens = max(1, min(request.max_output_tokens, self._output_tokens))
        finish: FinishReason = "length" if tokens < self._output_tokens else "stop"
        source, cached = self._reuse(request)
        stream = request.stream
        yield FirstToken(now, cached, source, OutputDelta(words(0, 1)) if stream else None)
        if stream:
            for i in range(1, tokens):
                yield TokenDelta(self._clock.now(), 1, OutputDelta(words(i, 1)))
        finished = self._clock.now()
        if request.session_final:
            self._sessions.pop(request.session_key, None)
        else:
            self._sessions[request.session_key] = request.prompt_tokens + tokens
            self._sessions.move_to_end(request.session_key)
            while len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)
        admission = Admission(request, now, now, False, source, cached)
        output = ModelOutput(words(0, tokens), finish_reason=finish)
        yield Finished(
            call_result(
                admission,
                self.name,
                output_tokens=tokens,
                first_token_s=now,
                finished_s=finished,
                output=output,
            )
        )

    def _reuse(self, request: CallRequest) -> tuple[KvSource, int]:
        held = self._sessions.get(request.session_key)
        if held is None:
            return KvSource.NEW, 0
        shared = request.shared_prefix_tokens
        if shared is None:
            shared = held
        reusable = max(0, min(shared, held, request.prompt_tokens - 1))
        return KvSource.HBM, reusable - reusable % self._block

    async def status(self) -> InstanceStatus:
        return self._status

    async def hint(self, session_key: str, expected_gap_s: float) -> None:
        return None

    async def end_sessions(self, session_keys: Sequence[str]) -> None:
        for session_key in session_keys:
            self._sessions.pop(session_key, None)

    async def resend_ends(self) -> None:
        return None

    async def session_moved(self, session_key: str) -> None:
        return None

    async def close(self) -> None:
        return None
