"""Types that cross the seams: a call as the runtime receives it, and what it reports back."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from talaria.core.calls import Call, ModelOutput, OutputDelta


class KvSource(StrEnum):
    """Where a call's reused prefix came from."""

    NEW = "new"  # first call of a session: nothing to reuse
    HBM = "hbm"  # prefix still in GPU memory: skipped
    HOST = "host"  # prefix restored from host DRAM over PCIe
    RECOMPUTE = "recompute"  # prefix gone: prefilled again


class Priority(StrEnum):
    """What a minute of a call's waiting costs its tenant: an ``interactive`` turn (a person
    waits), a ``standard`` agent step, a ``batch`` run (an evaluation, a nightly job). The node
    serves a higher class first, with a starvation bound for the lower ones
    (runtime/scheduling/fairness.py)."""

    INTERACTIVE = "interactive"
    STANDARD = "standard"
    BATCH = "batch"

    @property
    def rank(self) -> int:
        """0 for ``interactive`` (served first), 1 ``standard``, 2 ``batch``."""
        return PRIORITY_RANKS[self]


PRIORITY_RANKS = {Priority.INTERACTIVE: 0, Priority.STANDARD: 1, Priority.BATCH: 2}
DEFAULT_TENANT = "default"
"""The tenant of a call that names none (a replayed trace without tenants, a test)."""


class CallRejected(ValueError):
    """The engine refuses this call as asked: the caller's fault, not the runtime's (the proxy
    answers 400 with ``code``, e.g. ``context_length_exceeded``), unlike a runtime fault."""

    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


@dataclass(frozen=True)
class CallRequest:
    """One LLM call of a session: what the runtime schedules and the engine serves.

    ``prompt_tokens`` is the whole prompt (the proxy's estimate; an engine that tokenizes counts
    again); the part shared with the session's earlier calls is found by the runtime (prefix
    caching), not declared by the caller. ``max_output_tokens`` bounds generation.
    ``output_tokens`` is the reply's length when it is known in advance (a replayed trace): the
    simulated engine then generates exactly that many (like ``ignore_eos``); None lets the engine
    decide, as a real model stops at its end of sequence. ``expected_tool_gap_s`` is the
    caller's hint of the tool time that follows this call.
    """

    request_id: str
    session_key: str
    model: str
    prompt_tokens: int
    max_output_tokens: int
    call_index: int = 0
    expected_tool_gap_s: float | None = None
    session_final: bool = False
    stream: bool = False
    """The caller wants token deltas as they are generated (``TokenDelta`` events)."""
    shared_prefix_tokens: int | None = None
    """Tokens of this prompt equal to the session's previous prompt + output. Replay knows it
    from the trace; ``None`` means append-only (the whole cached prefix matches)."""
    parent_session_key: str | None = None
    """A sub-agent's parent session (its key on the runtime), whose KV the engine may reuse for
    the first ``parent_prefix_tokens`` tokens of this prompt (its system prompt and tools)
    when the session has no KV of its own there: prefix caching across sessions."""
    parent_prefix_tokens: int = 0
    call: Call | None = None
    """What the caller asked (messages or a prompt, tools, tool choice, sampling, reasoning,
    template kwargs: core/calls.py), for engines that render, tokenize or write a reply; None
    for a replayed trace entry, which has only token counts. The fields above are what the
    runtime schedules by: ``model``, ``stream`` and ``max_output_tokens`` (the call's own limit
    or the server's default) are the proxy's resolved values, and an engine reads them there."""
    cache_salt: str | None = None
    """Prefix-cache isolation key: calls with different salts never share cached KV (vLLM's
    ``cache_salt``; the proxy sets one per tenant)."""
    output_tokens: int | None = None
    tenant: str = DEFAULT_TENANT
    """Whose call it is, as an opaque key (the proxy sends a digest of its tenant id): the
    node shares its service between tenants by their weights (runtime/scheduling/fairness.py)."""
    tenant_weight: float = 1.0
    """The tenant's share weight (its API key's, ``talaria keys create --weight``), in (0, 100]."""
    priority: Priority = Priority.STANDARD
    deadline_s: float | None = None
    """Seconds after its arrival by which the caller wants it done (``X-Talaria-Deadline-S``):
    among calls of one class and tenant, the earliest deadline goes first."""
    agent: str = ""
    """The kind of agent the call comes from (the proxy sends its ``User-Agent``'s product name,
    e.g. ``claude-cli``; proxy/sessions/identity.py ``agent_kind``); "" when unknown (a replayed
    trace). The node learns tool gaps per (tenant, model, agent) (core/gaps.py)."""

    @property
    def live(self) -> bool:
        """A call with content (messages or a prompt), as opposed to a replayed trace entry
        that has only token counts."""
        call = self.call
        return call is not None and (call.messages is not None or call.prompt is not None)


@dataclass(frozen=True)
class EngineTimes:
    """When the engine itself saw a call's milestones, on the runtime's clock: vLLM's EngineCore
    timestamps (``RequestOutput.metrics``: queued, first scheduled, the step outputs holding the
    first and the last token), read in the engine's own process, before the runtime's API
    process hears of them. Against ``CallResult``'s times (taken where the runtime hears of
    them) they split a call into the engine's work and the host's:

    - intake = queued − admitted (the runtime and vLLM's front end hand the call over);
    - engine queue = scheduled − queued; engine prefill = first token − scheduled;
    - engine decode = last token − first token;
    - delivery lag = ``CallResult.first_token_s`` − first token (and ``finished_s`` − last
      token): the host's delay in passing an engine output on."""

    queued_s: float
    scheduled_s: float
    first_token_s: float
    last_token_s: float


@dataclass(frozen=True)
class CallResult:
    """A served call: its token counts, its times on the runtime's clock (arrival, admission,
    first token, finish), where its reused prefix came from, and what the engine generated."""

    request_id: str
    session_key: str
    model: str
    node: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    arrival_s: float
    admitted_s: float
    first_token_s: float
    finished_s: float
    kv_source: KvSource
    restored_bytes: float
    recomputed_tokens: int
    sp_admitted: bool
    output: ModelOutput | None = None
    """What the engine generated; None for a replayed trace entry (no content)."""
    slot_wait_s: float = 0.0
    """Clock seconds from the call's arrival until its model began serving on the node (the
    switch into its slot included): ``max(0, serving_since_s − arrival_s)``, with
    ``serving_since_s`` the end of the switch after which the model served without a break
    until the call's admission (a slot reopened for the same model is no break). 0 when the
    model was already serving at the call's arrival. ``queue_s − slot_wait_s`` is the wait for
    room while it served (batch, memory, admission rules). Set by the node scheduler; engines
    leave it 0."""
    engine: EngineTimes | None = None
    """The engine's own timestamps (``EngineTimes``): vLLM's, or the simulated engine's own
    milestones (ready, its first step, first and last token); None where an engine keeps
    none."""

    @property
    def latency_s(self) -> float:
        """Arrival to finish."""
        return self.finished_s - self.arrival_s

    @property
    def queue_s(self) -> float:
        """Arrival to admission."""
        return self.admitted_s - self.arrival_s


@dataclass(frozen=True)
class FirstToken:
    """The call's first output token exists at ``t_s``; ``cached_tokens`` of its prompt were
    reused (from ``kv_source``)."""

    t_s: float
    cached_tokens: int
    kv_source: KvSource
    delta: OutputDelta | None = None
    """What the first token says (None for a replayed trace entry)."""


@dataclass(frozen=True)
class TokenDelta:
    """``tokens`` more output tokens exist at ``t_s`` (streaming calls only; the first token is
    announced by ``FirstToken`` and not repeated here)."""

    t_s: float
    tokens: int
    delta: OutputDelta | None = None
    """What these tokens say (None for a replayed trace entry)."""


@dataclass(frozen=True)
class Finished:
    """The call is done: its ``CallResult``."""

    result: CallResult


GenerationEvent = FirstToken | TokenDelta | Finished
