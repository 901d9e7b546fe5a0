"""The connection edge of both servers (``talaria serve``, ``talaria runtime``): uvicorn's HTTP
protocol with a deadline on each request's head and a bound on open connections.

uvicorn closes a kept-alive connection that stays silent for ``timeout_keep_alive``, but
nothing bounds a connection that has begun a request and then sends its request line or its
headers a byte at a time: a few hundred of those hold as many descriptors for ever, and past
the process's descriptor limit ``accept`` fails, so every other client waits. Two rules:

- **Header deadline.** The request line and headers must arrive whole within
  ``header_timeout_s`` of the connection opening, or of the previous response on a kept-alive
  connection; otherwise the connection is closed (nothing is answered: the request is not
  known yet). A request whose head arrived is not bounded here (its body: core/body_deadline.py).
- **Connection bound.** Past ``max_connections`` open connections (default: half the
  process's descriptor limit), a new one is answered at once with ``503`` (``Retry-After: 1``,
  ``Connection: close``, OpenAI's error envelope, as the request is not read yet) and closed,
  so a flood turns into quick 503s instead of connections left waiting in the kernel's backlog
  for a descriptor (core/connection_gate.py, which also sizes the listen backlog). uvicorn's
  own ``limit_concurrency`` is checked only once a request's head has arrived, so a
  connection that never sends one still holds its descriptor: it does not bound this.
- **Lingering close.** A response that closes the connection before its request's body has
  all arrived (the 408 of a body past its deadline, a refusal sent before reading) half-closes
  instead: the response and a FIN go out, what the client still sends is read and discarded,
  and the socket closes when the client closes its side or ``LINGER_S`` later (as a refused
  connection does: core/connection_gate.py). Closed at once,
  the next byte the client sends meets a closed socket, the kernel answers with a reset, and
  the client reads ``ECONNRESET`` in place of the response (RFC 9112 §9.6, "Tear-down";
  docs/sources.md).

Imported by the servers and the proxy's HTTP clients: it needs uvicorn (both the proxy and the
runtime extras have it).
"""

from __future__ import annotations

import asyncio
import importlib.util
from dataclasses import dataclass
from typing import Any

import uvicorn

from talaria.core.connection_gate import Gate, accept_backlog, default_max_connections
from talaria.core.http_protocol import BoundedH11Protocol

HEADER_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 5.0
"""uvicorn's ``timeout_keep_alive`` on both servers (its default, set here so that the clients'
bound below follows it): an idle kept-alive connection is closed after this long."""
CLIENT_KEEP_ALIVE_S = KEEP_ALIVE_S - 1.0
"""How long the proxy's own clients (the runtime hop, the forwarding hop) keep an idle
connection: less than the servers' ``KEEP_ALIVE_S``, so that a client never sends a call on a
connection the server is closing at that moment (the call would fail, having maybe run).
aiohttp's default, 15 s, failed one forwarded call in 7,680 of bench/cluster_live.py."""
"""Default time for a request's line and headers to arrive (s)."""


@dataclass(frozen=True)
class EdgeBounds:
    """A server's bounds: ``talaria serve`` takes them from its settings, ``talaria runtime``
    runs the defaults."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    max_connections: int | None = None
    """None: core/connection_gate.py's default, half the descriptor limit."""


class BoundedConfig(uvicorn.Config):
    """uvicorn's Config with :class:`EdgeBounds`, the bounded HTTP protocol (httptools when
    it is installed, as uvicorn's ``auto`` picks, else h11), the :class:`Gate` of its
    connection bound, and the listen backlog that bound leaves room for. uvicorn's
    ``proxy_headers`` is off: on by default, it took a loopback peer's ``X-Forwarded-For`` as
    the client's address, which any client on the host (or behind a local proxy) writes as it
    likes; the proxy resolves forwarded addresses itself, from the proxies its operator trusts
    (proxy/contract/peer.py), and the runtime reads none."""

    def __init__(self, app: Any, bounds: EdgeBounds, **kwargs: Any) -> None:
        limit = bounds.max_connections or default_max_connections()
        super().__init__(
            app,
            http=protocol_class(),
            backlog=accept_backlog(limit),
            timeout_keep_alive=int(KEEP_ALIVE_S),
            proxy_headers=False,
            **kwargs,
        )
        self.header_timeout_s = bounds.header_timeout_s
        self.gate = Gate(limit)


def protocol_class() -> type[asyncio.Protocol]:
    """The bounded protocol over httptools when it is installed, else over h11
    (core/http_protocol.py)."""
    if importlib.util.find_spec("httptools") is None:
        return BoundedH11Protocol
    from talaria.core.http_edge_httptools import BoundedHttpToolsProtocol

    return BoundedHttpToolsProtocol
