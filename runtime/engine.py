"""The ``Engine`` seam: one model's executor on a node.

The slot scheduler drives engines only through this module's protocols, so the simulated
engine (``engines.sim.SimEngine``, timed by the cost model), the vLLM engine, the upstream
engine and any other are interchangeable. ``Engine`` is what every engine must do: start and
stop, estimate, admit (``try_admit`` decides synchronously whether the call can start now and
commits what it needs) and serve (``run`` streams the call's events). What only some engines
do is an optional capability, a small protocol of its own that an engine implements or not:

- ``Switching``: its model is switched in and out (weights woken and put to sleep);
- ``Staging``: its weights can be copied in ahead of a switch;
- ``MemoryAccounting``: its KV and weights are accounted in the node's ``NodeMemory``, so the
  node may keep a call waiting, or a switch, until they fit;
- ``KvTiming``: what bringing a session's KV back costs, for routing;
- ``OwnKv``: the sessions' KV it holds in a pool of its own.

The node detects them when it takes an engine (runtime/scheduling/driven.py, where what each
one's absence means is written once), so an engine that does not switch or account memory
implements none of it rather than answering with constants. Switch operations return the
seconds they took, for the slot timeline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, runtime_checkable

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
    """One model's executor on a node, as the slot scheduler drives it: what every engine must
    do (the module docstring says how admission is split, and which capabilities are
    optional). runtime/engine_kinds.py's ``ENGINES`` registers the implementations a node config
    may name."""

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
    def running(self) -> int:
        """Calls admitted and not yet finished."""
        ...

    @property
    def busy_s(self) -> float:
        """Seconds it was busy so far (serving some call, or its device's work), for the
        node's busy figures."""
        ...

    def estimate_service_s(self, request: CallRequest, expected_output_tokens: int) -> float:
        """Seconds the call would take if admitted now (prefill or restore + decode)."""
        ...

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """Seconds of one decode step of ``batch`` sequences holding ``context_tokens`` in all
        (the fair queue's guard of a higher class's calls: runtime/scheduling/intake.py)."""
        ...

    def try_admit(
        self, request: CallRequest, arrival_s: float, sp_admitted: bool
    ) -> Admission | None:
        """Commit what the call needs (memory, evicting idle KV or staged weights) and admit
        it, or return None: it cannot start now. Asked only while the model is in (a
        ``Switching`` engine: ``active``)."""
        ...

    def run(self, admission: Admission) -> AsyncIterator[GenerationEvent]:
        """Serve an admitted call: ``FirstToken``, ``TokenDelta``s if the request streams,
        then ``Finished`` with its ``CallResult`` (``call_result`` builds it). Raising
        ``CallRejected`` fails just this call as the caller's fault."""
        ...

    def info(self) -> EngineInfo:
        """What a calibration needs to know about it (in the runtime's status)."""
        ...


@runtime_checkable
class Switching(Protocol):
    """An engine whose model is switched in and out: its weights woken and put to sleep (or
    a gate opened and closed), in the slot scheduler's transitions. Without it the node gates
    the engine itself: in or out as the slot decides, at no cost, holding nothing that
    co-residency must fit."""

    @property
    def active(self) -> bool:
        """Whether the model is switched in: it admits calls (``try_admit``) only then."""
        ...

    @property
    def weight_bytes(self) -> float:
        """HBM its weights take while active (what co-residency must fit)."""
        ...

    def switch_in_s(self) -> float:
        """Seconds ``activate`` would take now (wake, or the rest of staging + device copy)."""
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


@runtime_checkable
class Staging(Protocol):
    """An engine whose weights can be copied in ahead of a switch, while another model
    serves (``d2d_staging``). Without it nothing is staged."""

    @property
    def staging(self) -> bool:
        """Whether weights are being (or have been) staged ahead of a switch."""
        ...

    @property
    def staged_fraction(self) -> float:
        """The share of its weights staged so far (0 when not staging), for the status."""
        ...

    def start_staging(self) -> bool:
        """Begin copying the weights in ahead of a switch, if there is room now; whether it
        began."""
        ...

    def cancel_staging(self) -> None:
        """Stop staging and release what it claimed."""
        ...


@runtime_checkable
class MemoryAccounting(Protocol):
    """An engine whose sessions' KV and whose weights live in the node's ``NodeMemory``
    (runtime/memory/), so the node's admission and transitions weigh them: a call waits, or a
    switch, until its bytes fit. Without it the engine manages its memory itself (vLLM's and
    an upstream server's pools preempt or queue when full): the node never keeps a call or a
    switch waiting for memory on its behalf."""

    def kv_bytes(self, tokens: int) -> float:
        """Physical KV bytes of one sequence of ``tokens`` on the node."""
        ...

    def kv_floor_bytes(self) -> float:
        """The least KV room the engine needs beside its weights to be worth activating."""
        ...

    def needed_bytes(self, request: CallRequest) -> float:
        """HBM bytes the call would add if admitted now (beyond what its session holds)."""
        ...

    def can_activate(self) -> bool:
        """Whether ``activate`` would find room for the weights now (idle KV may be evicted
        for them; running calls' KV may not)."""
        ...


@runtime_checkable
class KvTiming(Protocol):
    """An engine that knows what a session's KV saves: the seconds to bring it back from host
    memory and to prefill it again, in the status routing reads. Without it a session's KV
    counts for routing only while in HBM."""

    def kv_restore_s(self, tokens: int) -> float:
        """Seconds to bring ``tokens`` of a session's KV from host memory into HBM."""
        ...

    def recompute_s(self, tokens: int) -> float:
        """Seconds to prefill ``tokens`` again if their KV is gone."""
        ...


@dataclass(frozen=True)
class ClassStepRule:
    """The fair queue's rule 5 (runtime/scheduling/fairness.py), as the node hands it to an
    engine with ``StepsByClass``: lower-class calls already running step only while the
    engine's decode step with them stays ≤ ``class_slowdown`` × the best class's alone, each
    preempted at most ``preempt_limit`` times (``class_steps``, applied by
    runtime/engines/class_holds.py ``ClassHolds``)."""

    class_slowdown: float
    preempt_limit: int


Step = TypeVar("Step")


def class_steps(
    ready: Sequence[Step],
    rank: Callable[[Step], int],
    preempted: Callable[[Step], int],
    step_s: Callable[[Sequence[Step]], float],
    class_slowdown: float,
    preempt_limit: int,
) -> list[Step]:
    """Rule 5: of ``ready`` (in admission order), the calls that take the next iteration:
    every call of the best ``rank``, every call already preempted ``preempt_limit`` times,
    and each other call (best rank first, then admission order) while ``step_s`` of the
    chosen ones with it ≤ ``class_slowdown`` × ``step_s`` of the best rank's calls alone.
    Returned in admission order. One class: ``ready`` as it is."""
    if not ready:
        return []
    best = min(rank(c) for c in ready)
    if all(rank(c) == best for c in ready):
        return list(ready)
    chosen = {i for i, c in enumerate(ready) if rank(c) == best or preempted(c) >= preempt_limit}
    bound = class_slowdown * step_s([c for c in ready if rank(c) == best])
    others = sorted((i for i in range(len(ready)) if i not in chosen), key=lambda i: rank(ready[i]))
    for i in others:
        if step_s([ready[j] for j in sorted(chosen | {i})]) <= bound:
            chosen.add(i)
    return [ready[i] for i in sorted(chosen)]


@runtime_checkable
class StepsByClass(Protocol):
    """An engine that applies the fair queue's rule 5 to its own steps: the calls of a
    lower class already running yield their steps to a higher class's (fairness.py
    ``class_steps``). Without it every running call takes every step."""

    def step_by_class(self, rule: ClassStepRule | None) -> None:
        """Apply ``rule`` from now on (None: every call takes every step)."""
        ...

    @property
    def preemptions(self) -> int:
        """Times a running call has been held out of an iteration for a higher class so far
        (the runtime's status shows it per engine)."""
        ...


@runtime_checkable
class OwnKv(Protocol):
    """An engine that keeps its sessions' KV in a pool of its own, outside the node's
    ``NodeMemory`` (vLLM's, an upstream server's), and tells the node which sessions it
    holds. Without it the node reports the KV ``NodeMemory`` holds, and nothing else."""

    def session_kv(self) -> Mapping[str, tuple[int, KvSource]]:
        """KV this engine holds outside the node's ``NodeMemory``, by session: (tokens,
        ``HBM`` or ``HOST``)."""
        ...


@runtime_checkable
class Health(Protocol):
    """An engine that can find itself unable to serve (an upstream server that does not
    answer) and says so: the node's status then leaves the model out, so the proxy routes its
    calls to other instances, until the engine finds it can serve again. Without it an engine
    always can."""

    def fault(self) -> str | None:
        """Why the engine cannot serve now; None when it can."""
        ...


CAPABILITIES: tuple[type, ...] = (Switching, Staging, MemoryAccounting, KvTiming, OwnKv, Health)
"""The optional capabilities, in the order the docs list them."""
