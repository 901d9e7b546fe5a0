"""What the proxy's HTTP edge found out about a request before its route ran (:class:`Arrival`),
and the one thing a route tells the edge back: the time its call spends in its runtime.

The edge is pure ASGI middleware (proxy/edge/peer.py, proxy/edge/http.py): the request's scope
is the one thing it shares with the route, so the arrival rides in it, under
:data:`ARRIVAL_KEY` (a namespaced scope key, as ASGI's extensions are), one typed object
instead of loose attributes on ``request.state``. Nothing of the call itself is kept there:
its caller, its session's identity and its body's bytes travel in the call's own context
(proxy/callpath/call.py ``CallContext``), handed from stage to stage.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import HTTPConnection

from talaria.proxy.contract.calls import RuntimeClock

ARRIVAL_KEY = "talaria.arrival"
"""The scope key of a request's :class:`Arrival`."""


@dataclass
class Arrival:
    """A request as the edge found it, each field set once, in the order the edge runs
    (outermost first): ``relayed`` (proxy/edge/peer.py), then ``request_id``,
    ``forwarded_by`` and ``body_sha256`` (proxy/edge/http.py ``RequestIdMiddleware``, before
    any route), and ``runtime_clock`` by the route, once its call runs (or is relayed to its
    owner replica), which the edge's overhead header leaves out."""

    request_id: str = ""
    """The request's id (``x-request-id``): the forwarding peer's, or a new one."""
    forwarded_by: str | None = None
    """The peer replica that forwarded the request, its signature checked (proxy/cluster/
    trust.py); None: a client's request."""
    body_sha256: str | None = None
    """A forward's body digest, which the body read must match (proxy/callpath/context.py
    ``read_bytes``)."""
    relayed: bool = False
    """Whether a peer the operator does not trust relayed the request (proxy/contract/peer.py):
    its address says nothing of the caller."""
    runtime_clock: RuntimeClock | None = None
    """The time the request's call spends in its runtime (``x-talaria-overhead-ms`` leaves
    it out)."""

    @property
    def forwarded(self) -> bool:
        """Whether a peer replica forwarded the request (then it is served here, whoever
        owns its session)."""
        return self.forwarded_by is not None


def arrival_in(scope: MutableMapping[str, Any]) -> Arrival:
    """The request's arrival, made empty by the first part of the edge that asks."""
    found = scope.get(ARRIVAL_KEY)
    if found is None:
        found = scope[ARRIVAL_KEY] = Arrival()
    assert isinstance(found, Arrival)
    return found


def arrival_of(request: HTTPConnection) -> Arrival:
    """The arrival of ``request`` (:func:`arrival_in` its scope)."""
    return arrival_in(request.scope)
