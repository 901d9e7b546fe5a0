"""``PeerAddress``: the edge middleware that puts the client a trusted proxy relayed in the
request's ``client`` and ``scheme`` (proxy/contract/peer.py has the rule), and marks a request
an untrusted peer relayed (``Arrival.relayed``: proxy/contract/arrival.py). With no trusted
proxy (the default, ``TALARIA_TRUSTED_PROXIES`` empty) the connection's peer is the client,
whatever the request's headers say."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from talaria.proxy.contract.arrival import arrival_in
from talaria.proxy.contract.peer import IpNetwork, resolve

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class PeerAddress:
    """Pure ASGI: resolves each HTTP request's client against ``networks`` (the trusted
    proxies) before anything reads it."""

    def __init__(self, app: ASGIApp, networks: Sequence[IpNetwork] = ()) -> None:
        self.app = app
        self.networks = tuple(networks)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            client = scope.get("client")
            host = client[0] if client else None
            found = resolve(host, scope.get("scheme", "http"), scope["headers"], self.networks)
            if found.relayed:
                arrival_in(scope).relayed = True
            elif found.host != host:
                scope["client"] = (found.host, 0)
            scope["scheme"] = found.scheme
        await self.app(scope, receive, send)
