"""A call's context at the door (:class:`CallContext`): what the door's stages found out about
one LLM request, handed explicitly from stage to stage (proxy/callpath/door.py):

1. ``read_body`` authenticates the caller, reads the body, identifies the session and, when a
   header names it, places the call: it builds the context;
2. the dialect's route parses the body into an ``ApiCall`` (proxy/contract/calls.py);
3. ``open_call`` takes both: normalises the prompt, places the call by its body, counts it
   against its key's rate limits, checks its model, and hands the gateway a ``PreparedCall``,
   whose own stages carry a ``GatewayCall`` (proxy/callpath/stages.py).

Nothing of the call is kept on the HTTP request (``request.state``); what the edge found
before the route ran is the request's ``Arrival`` (proxy/contract/arrival.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from talaria.proxy.callpath.context import ProxyContext
from talaria.proxy.contract.arrival import Arrival
from talaria.proxy.contract.calls import Caller, Share
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.contract.identity import Identity


@dataclass(frozen=True)
class Identified:
    """A request's session identity as ``read_body`` found it: the identity, or the 400 of
    a malformed id or hint (raised by ``open_call``, once the call is parsed)."""

    identity: Identity | None
    error: ApiError | None = None

    def get(self) -> Identity:
        """The identity, or its error raised."""
        if self.identity is None:
            assert self.error is not None
            raise self.error
        return self.identity


class KeptBody:
    """The request body's bytes, kept while the call may still be forwarded to its owner
    replica as it came (only with replicas: None otherwise), and dropped once it is served
    here: a body's bytes, its JSON's objects and its dialect's model held together for a
    whole call were ~11× its size (docs/proxy-overhead.md). The one part of a call's context
    that changes."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes | None) -> None:
        self.raw = raw

    def drop(self) -> None:
        """The call is served here: its bytes are no longer needed."""
        self.raw = None


@dataclass(frozen=True)
class CallContext:
    """One LLM request at the door (module docstring): the HTTP request (its headers, and a
    replica's forward of it), the proxy's services, what the edge found (``arrival``: the
    request id, a peer's forward), who sends it (``caller``: the tenant, its key's share,
    rate limits and switches), its session's identity (``identified``: the id, the class
    and deadline its headers ask, hints), its body's bytes while a replica may forward them,
    and whether it was already placed (a header named its session: its owner was asked before
    the body was parsed)."""

    request: Request
    proxy: ProxyContext
    arrival: Arrival
    caller: Caller
    identified: Identified
    kept: KeptBody
    placed: bool = False

    @property
    def tenant(self) -> str:
        """The caller's tenant."""
        return self.caller.tenant_id

    @property
    def request_id(self) -> str:
        """The request's id (``x-request-id``)."""
        return self.arrival.request_id

    def share(self, identity: Identity) -> Share:
        """The call's terms in the node's fair queue: its key's weight, the class its headers
        ask within the key's ceiling (``Caller.served``: lower than the key's, never higher
        than ``--max-priority``), its headers' deadline."""
        caller = self.caller
        return Share(caller.served(identity.priority), caller.share.weight, identity.deadline_s)

    @property
    def normalises_prompts(self) -> bool:
        """Whether the engine gets the call's prompt normalised: its key's
        ``normalise_prompts``, else ``TALARIA_NORMALISE_PROMPTS``."""
        keyed = self.caller.normalise_prompts
        return self.proxy.settings.normalise_prompts if keyed is None else keyed
