"""The ``Engine`` seam: one model's executor on a node.

The slot scheduler drives engines only through this protocol, so the simulated engine
(``engines.sim.SimEngine``, timed by the cost model) and a vLLM-backed engine are
interchangeable. Admission is split in two: ``try_admit`` decides synchronously whether the
call fits HBM now (evicting idle KV as needed) and commits the memory; ``run`` then streams the
call's events. Switch operations return the seconds they took, for the slot timeline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from talaria.core.calls import ModelOutput
from talaria.core.types import CallRequest, CallResult, EngineTimes, GenerationEvent, KvSource


@dataclass(frozen=True)
class Admission:
    """A call accepted by an engine: its memory is committed; ``run`` serves it."""

    request: CallRequest
    arrival_s: float
    admitted_s: float
    sp_admitted: bool
    kv_source: KvSource
    cached_tokens: int


def call_result(
    admission: Admission,
    node: str,
    *,
    output_tokens: int,
    first_token_s: float,
    finished_s: float,
    output: ModelOutput | None,
    prompt_tokens: int | None = None,
    cached_tokens: int | None = None,
    kv_source: KvSource | None = None,
    restored_bytes: float = 0.0,
    recomputed_tokens: int = 0,
    engine: EngineTimes | None = None,
) -> CallResult:
    """The ``CallResult`` of an admitted call, the one builder every engine uses.

    From the admission: the request's ids and model, arrival, admission time and SP flag;
    ``prompt_tokens`` defaults to the request's, ``cached_tokens`` and ``kv_source`` to the
    admission's (an engine that counts again, as vLLM does, passes its own). ``node``: the
    node's name. ``slot_wait_s`` is left 0 (the node scheduler sets it)."""
    request = admission.request
    return CallResult(
        request_id=request.request_id,
        session_key=request.session_key,
        model=request.model,
        node=node,
        prompt_tokens=request.prompt_tokens if prompt_tokens is None else prompt_tokens,
        cached_tokens=admission.cached_tokens if cached_tokens is None else cached_tokens,
        output_tokens=output_tokens,
        arrival_s=admission.arrival_s,
        admitted_s=admission.admitted_s,
        first_token_s=first_token_s,
        finished_s=finished_s,
        kv_source=admission.kv_source if kv_source is None else kv_source,
        restored_bytes=restored_bytes,
        recomputed_tokens=recomputed_tokens,
        sp_admitted=admission.sp_admitted,
        output=output,
        engine=engine,
    )


@dataclass(frozen=True)
class EngineSnapshot:
    """An engine's state for the node's status: active, running calls, the staged fraction of
    its weights, and its busy seconds so far."""

    model: str
    active: bool
    running: int
    staged_fraction: float
    busy_s: float


@dataclass(frozen=True)
class EngineInfo:
    """What a calibration needs to know about an engine (``talaria calibrate`` reads it from the
    runtime's status)."""

    kind: str
    """"sim" or "vllm"."""
    switches_cost: bool
    """Whether activating/deactivating moves weights (GPU sleep mode, simulated engines); False
    for vLLM's CPU gate, whose switches take ~0 s by construction."""
    block_tokens: int
    max_num_batched_tokens: int | None
    max_model_len: int
    """The longest prompt + output the engine accepts."""


class Engine(Protocol):
    """One model's executor on a node, as the slot scheduler drives it (the module docstring
    says how admission and switches are split). runtime/factory.py's ``ENGINES`` registers the
    implementations a node config may name."""

    model: str
    """The model it serves (the node's key for it, and the results' ``model``)."""

    async def start(self) -> None:
        """Bring the engine up (a real engine loads its model; start a node's engines one at
        a time). Idempotent."""
        ...

    async def shutdown(self) -> None:
        """Release what ``start`` took, without blocking the event loop."""
        ...

    @property
    def active(self) -> bool:
        """Whether the model is switched in: it admits calls (``try_admit``) only then."""
        ...

    @property
    def running(self) -> int:
        """Calls admitted and not yet finished."""
        ...

    def estimate_service_s(self, request: CallRequest, expected_output_tokens: int) -> float:
        """Seconds the call would take if admitted now (prefill or restore + decode)."""
        ...

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """Seconds of one decode step of ``batch`` sequences holding ``context_tokens`` in all
        (the fair queue's guard of a higher class's calls: runtime/scheduling/intake.py)."""
        ...

    def kv_bytes(self, tokens: int) -> float:
        """Physical KV bytes of one sequence of ``tokens`` on the node."""
        ...

    @property
    def weight_bytes(self) -> float:
        """HBM its weights take while active (what co-residency must fit)."""
        ...

    def kv_floor_bytes(self) -> float:
        """The least KV room the engine needs beside its weights to be worth activating."""
        ...

    def can_activate(self) -> bool:
        """Whether ``activate`` would find room for the weights now (idle KV may be evicted
        for them; running calls' KV may not)."""
        ...

    def switch_in_s(self) -> float:
        """Seconds ``activate`` would take now (wake, or the rest of staging + device copy)."""
        ...

    def kv_restore_s(self, tokens: int) -> float:
        """Seconds to bring ``tokens`` of a session's KV from host memory into HBM."""
        ...

    def recompute_s(self, tokens: int) -> float:
        """Seconds to prefill ``tokens`` again if their KV is gone."""
        ...

    def needed_bytes(self, request: CallRequest) -> float:
        """HBM bytes the call would add if admitted now (beyond what its session holds)."""
        ...

    def try_admit(
        self, request: CallRequest, arrival_s: float, sp_admitted: bool
    ) -> Admission | None:
        """Commit memory for the call (evicting idle KV or staged weights) or return None."""
        ...

    def run(self, admission: Admission) -> AsyncIterator[GenerationEvent]:
        """Serve an admitted call: ``FirstToken``, ``TokenDelta``s if the request streams,
        then ``Finished`` with its ``CallResult`` (``call_result`` builds it). Raising
        ``CallRejected`` fails just this call as the caller's fault."""
        ...

    async def activate(self) -> float:
        """Switch the model in (wake its weights, or finish staging them); returns the
        seconds it took."""
        ...

    async def deactivate(self, keep_kv_on_host: bool, keep_host_weight_copy: bool) -> float:
        """Switch the model out once its calls have drained; ``keep_kv_on_host``: move its
        sessions' KV to host memory rather than drop it; ``keep_host_weight_copy``: a pinned
        host copy of the weights exists, so nothing needs copying out. Returns the seconds it
        took."""
        ...

    def start_staging(self) -> bool:
        """Begin copying the weights in ahead of a switch, if there is room now; whether it
        began."""
        ...

    @property
    def staging(self) -> bool:
        """Whether weights are being (or have been) staged ahead of a switch."""
        ...

    def cancel_staging(self) -> None:
        """Stop staging and release what it claimed."""
        ...

    def snapshot(self) -> EngineSnapshot:
        """Its state now, for the node's status."""
        ...

    def info(self) -> EngineInfo:
        """What a calibration needs to know about it (in the runtime's status)."""
        ...

    def session_kv(self) -> Mapping[str, tuple[int, KvSource]]:
        """KV this engine holds outside the node's ``NodeMemory`` (a real engine's own pool),
        by session: (tokens, ``HBM`` or ``HOST``). The simulated engine keeps its KV in
        ``NodeMemory``, which the node reads directly: it returns nothing here."""
        ...
