"""The call contract between the API layer and the gateway: what a route hands in
(:class:`PreparedCall`), what it gets back (:class:`CallHandle`, whose events end in a
:class:`CallOutcome` or an ``ApiError``), and the messages a client is told when a call cannot
finish."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.requests import ClientDisconnect

from talaria.core.calls import Call, Message, ModelOutput
from talaria.core.types import CallResult, Priority
from talaria.proxy.contract.identity import Identity
from talaria.proxy.contract.records import Record


class CallAbandoned(ClientDisconnect):
    """The client of a call it waited on whole disconnected while the call ran: the call was
    abandoned (stopped, recorded ``cancelled``), and no one is left to answer."""


Api = str
"""The name of the dialect route a call came through (``CallRecord.api``): ``chat``,
``completions``, ``messages``, ``responses``, or a new dialect's own."""

SHUTDOWN = "The server is shutting down; retry the call."
"""What a call refused or cut off by the shutdown answers (a 503)."""


@dataclass(frozen=True)
class ApiCall:
    """A call as its dialect parsed it, for the door to open (proxy/callpath/door.py
    ``open_call``): the route it came through, what it asks (``content``), the body as JSON
    if a replica must forward it so (``body``), where the
    dialect carries a response format (named when its schema is too large), and the records
    the dialect adds to the call's own when it succeeds (the Responses API's stored
    response)."""

    api: Api
    content: Call
    body: Any = None
    """The body as JSON, for a replica to forward when its bytes were not kept; None: the
    bytes as they came (kept in the call's context: proxy/callpath/call.py ``KeptBody``).
    The dialects pass None, so that the JSON's objects do not live as long as the call."""
    format_param: str = "response_format"
    extra_records: Callable[[CallOutcome], Sequence[Record]] | None = None


@dataclass(frozen=True)
class Share:
    """A call's terms in the node's fair queue (``CallRequest``'s ``priority``,
    ``tenant_weight`` and ``deadline_s``): its class, its tenant's share weight (in (0,
    ``core.protocol_calls.MAX_TENANT_WEIGHT``]) and the wall seconds after its arrival by which its
    caller wants it done (None: no deadline). An API key's defaults are a ``Share`` without a
    deadline; a call's headers may lower its class (never past the key's ceiling:
    ``Caller.served``) and name its deadline (proxy/sessions/identity.py)."""

    priority: Priority = Priority.STANDARD
    weight: float = 1.0
    deadline_s: float | None = None


@dataclass(frozen=True)
class RateLimits:
    """An API key's rate limits (``talaria keys create --rpm --tpm``): the calls it may start
    and the tokens (prompt + output) its calls may use per minute, counted by the key's id
    across replicas (proxy/callpath/limiter.py); None: that one is not limited."""

    key_id: str
    rpm: int | None = None
    tpm: int | None = None


@dataclass(frozen=True)
class Caller:
    """Who sends a call, as its API key says (proxy/callpath/auth.py): its tenant, the share
    its calls get unless their headers ask a lower class (``talaria keys create --priority
    --weight``; ``TALARIA_API_KEYS`` and open mode: ``standard``, weight 1), its key's rate
    limits (None: a key without any, ``TALARIA_API_KEYS`` and open mode), whether the
    engine gets its calls' prompts normalised (``--normalise-prompts`` /
    ``--no-normalise-prompts``; None: as ``TALARIA_NORMALISE_PROMPTS`` says), and the highest
    class its calls may ask for (``--max-priority``; None: the key's own priority)."""

    tenant_id: str
    share: Share = Share()
    limits: RateLimits | None = None
    normalise_prompts: bool | None = None
    max_priority: Priority | None = None

    @property
    def ceiling(self) -> Priority:
        """The highest class its calls are served in: ``max_priority``, else its key's."""
        return self.max_priority if self.max_priority is not None else self.share.priority

    def served(self, asked: Priority | None) -> Priority:
        """The class a call of this caller is served in: the class its ``X-Talaria-Priority``
        header asked (None: none), never above :attr:`ceiling` (a header may lower the key's
        class, never raise it past what the operator granted); without a header, the key's
        own class."""
        if asked is None:
            return self.share.priority
        return asked if asked.rank >= self.ceiling.rank else self.ceiling


@dataclass(frozen=True)
class NormalisedPrompt:
    """What prompt normalisation (proxy/sessions/normalise.py) took out of a call's system
    text: the volatile parts' names (the table's rows, in its order), the call's messages
    without them (what its session is found by), the first message it changed, and whether
    the engine gets these messages (the switch: ``TALARIA_NORMALISE_PROMPTS``, its key's
    override) or the client's own (then the KV the engine can reuse ends before ``first``)."""

    parts: tuple[str, ...]
    messages: tuple[Message, ...]
    first: int
    engine: bool = True


@dataclass(frozen=True)
class PreparedCall:
    """What the API layer extracted from a request: what the call asks (``content``: the
    normalized call), who sent it, and through which dialect."""

    request_id: str
    tenant_id: str
    identity: Identity
    api: Api
    content: Call
    max_tokens: int
    """The output limit: the call's own, or the server's default."""
    extra_records: Callable[[CallOutcome], Sequence[Record]] | None = None
    """Records the API adds to the call's own when it succeeds, committed with them."""
    route_key: str | None = None
    """The session's key among proxy replicas (proxy/cluster/owner.py), when there are any."""
    format_param: str = "response_format"
    """Where the dialect carries a response format (``ApiCall.format_param``)."""
    share: Share = Share()
    """Its terms in the node's fair queue: its key's, its headers' within them (the class:
    ``Caller.served``)."""
    on_settled: Callable[[int], None] | None = None
    """Told the tokens the call is charged when it ends, however it ends (its key's rate
    limits settle its reservation: proxy/callpath/limiter.py, limits.py ``charge``)."""
    normalised: NormalisedPrompt | None = None
    """The volatile parts taken out of its system text (None: none were): its session is
    found by ``normalised.messages``; ``content`` is what the engine gets."""

    @property
    def session_messages(self) -> tuple[Message, ...] | None:
        """The messages its session is found by: normalised, else its own (None: a text
        prompt)."""
        return self.normalised.messages if self.normalised is not None else self.content.messages

    @property
    def model(self) -> str:
        """The model the call asks for."""
        return self.content.model

    @property
    def stream(self) -> bool:
        """Whether the client asked for a stream."""
        return self.content.stream


@dataclass(frozen=True)
class CallOutcome:
    """A call that finished: the runtime's result, the instance that ran it, and the output
    the engine wrote."""

    result: CallResult
    instance: str
    output: ModelOutput


OVERHEAD_HEADER = "x-talaria-overhead-ms"
"""The proxy's own time of a request, in milliseconds, on every response (proxy/edge/http.py): from
its arrival to its response headers (for the histogram ``talaria_proxy_overhead_seconds``: to
its last byte), less the time its call spent in the runtime (``RuntimeClock``). A stream's
headers go out as its call starts, so there it is the time before the runtime; a non-streamed
reply's includes the commit of its records. A replica that forwards a call counts the owner's
overhead in and the owner's runtime time out (proxy/cluster/forward.py)."""


@dataclass
class RuntimeClock:
    """The wall time a call spends in its runtime: from its request sent to the runtime's
    stream ended (``time.perf_counter`` seconds). The rest of a request's time is the
    proxy's own (``x-talaria-overhead-ms``, proxy/edge/http.py)."""

    started: float | None = None
    ended: float | None = None

    def elapsed(self, now: float) -> float:
        """Seconds in the runtime up to ``now`` (0 before the call reached it)."""
        if self.started is None:
            return 0.0
        return (self.ended if self.ended is not None else now) - self.started


EventKind = Literal["first", "delta", "done", "error"]
Events = asyncio.Queue[tuple[EventKind, Any]]
"""A running call's events, as :class:`CallHandle` describes them."""


@dataclass
class CallHandle:
    """A running call: ``events`` receives ("first", OutputDelta | None), ("delta",
    OutputDelta | None), ("done", CallOutcome) or ("error", ApiError); ``task`` runs to the
    end regardless of who reads."""

    events: Events
    task: asyncio.Task[CallOutcome | None]
    running_on: Callable[[], str]
    """The instance running the call now (another than the routed one if that one could
    not be reached: proxy/callpath/runner.py)."""
    session_id: str
    """The client's id of the session (its key for an implicit session)."""
    session_key: str
    how: str
    """How the session was found: new, continued, retry or child."""
    abandon: Callable[[], None] = lambda: None
    """The client went away: stop the call (proxy/callpath/runner.py, ``CallRunner.abandon``)."""
    clock: RuntimeClock = field(default_factory=RuntimeClock)
    """The call's time in its runtime."""

    @property
    def instance(self) -> str:
        """The instance running the call now."""
        return self.running_on()

    def headers(self) -> dict[str, str]:
        """The headers a reply carries: the session's id, key and how it was found, and the
        call's instance as of now (a non-streamed reply, sent at the call's end, names the
        one that ran it)."""
        return {
            "x-talaria-session-id": self.session_id,
            "x-talaria-session-key": self.session_key,
            "x-talaria-session-how": self.how,
            "x-talaria-instance": self.instance,
        }

    async def outcome(self) -> CallOutcome:
        """Wait for the call's end: its outcome, or its ``ApiError`` raised."""
        while True:
            kind, value = await self.events.get()
            if kind == "done":
                assert isinstance(value, CallOutcome)
                return value
            if kind == "error":
                raise value
