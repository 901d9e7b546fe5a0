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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from talaria.core.connection_gate import (
    LINGER_S,
    Gate,
    accept_backlog,
    default_max_connections,
)

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
    """The bounded protocol over httptools when it is installed, else over h11."""
    if importlib.util.find_spec("httptools") is None:
        return BoundedH11Protocol
    from talaria.core.http_edge_httptools import BoundedHttpToolsProtocol

    return BoundedHttpToolsProtocol


class HeaderDeadline:
    """One connection's clock: :meth:`arm` when it starts waiting for a request head (opened,
    or a response finished); when ``timeout_s`` passes and the connection is still ``idle`` (no
    request in progress: its head never arrived), ``close`` it."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        timeout_s: float,
        idle: Callable[[], bool],
        close: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._timeout_s = timeout_s
        self._idle = idle
        self._close = close
        self._timer: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        """Start (or restart) the ``timeout_s`` countdown, in loop seconds."""
        self.cancel()
        self._timer = self._loop.call_later(self._timeout_s, self._expire)

    def cancel(self) -> None:
        """Stop the countdown, if one is running."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self._idle():
            self._close()


class LingeringTransport:
    """The connection's transport as uvicorn's protocol sees it: :meth:`close` while
    ``body_pending()`` half-closes and lingers (module docstring), any other close is at once.
    Everything else is the socket transport's own."""

    def __init__(
        self,
        inner: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        body_pending: Callable[[], bool],
    ) -> None:
        self._inner = inner
        self._loop = loop
        self._body_pending = body_pending
        self._timer: asyncio.TimerHandle | None = None
        self.lingering = False

    def close(self) -> None:
        """Close now, or, while the request's body is still arriving, send what is buffered
        and a FIN, keep reading (to drop it), and close after ``LINGER_S``."""
        if self.lingering:
            return
        if not self._body_pending() or not self._inner.can_write_eof():
            self._inner.close()
            return
        self.lingering = True
        self._inner.write_eof()
        self._inner.resume_reading()  # flow control may have paused it mid-body
        self._timer = self._loop.call_later(LINGER_S, self._inner.close)

    def is_closing(self) -> bool:
        """True once closed or lingering: nothing more is written."""
        return self.lingering or self._inner.is_closing()

    def cancel(self) -> None:
        """The socket is gone: stop the linger timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class BoundedProtocol:
    """The header deadline and the connection bound for a uvicorn HTTP protocol class, mixed in
    ahead of it (``class X(BoundedProtocol, H11Protocol)``): one definition for h11 and
    httptools (core/http_edge_httptools.py)."""

    loop: asyncio.AbstractEventLoop
    connections: set[Any]
    transport: asyncio.Transport
    cycle: Any

    def __init__(
        self,
        config: BoundedConfig,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)  # type: ignore[call-arg]
        self._gate = config.gate
        self._deadline = HeaderDeadline(
            self.loop, config.header_timeout_s, self._idle, self._close_idle
        )
        self._lingering: LingeringTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Refuse the connection if the gate is full; else serve it (through a
        :class:`LingeringTransport`) and arm the deadline."""
        # a stream server's transports are Transports (asyncio.Protocol's own signature)
        socket_transport = cast(asyncio.Transport, transport)
        if self._gate.refuse_if_full(socket_transport, len(self.connections)):
            return
        self._lingering = LingeringTransport(socket_transport, self.loop, self._body_pending)
        super().connection_made(cast(asyncio.Transport, self._lingering))  # type: ignore[misc]
        self._deadline.arm()

    def data_received(self, data: bytes) -> None:
        """Drop what arrives on a lingering connection; else parse it as uvicorn does."""
        if self._lingering is not None and self._lingering.lingering:
            return
        super().data_received(data)  # type: ignore[misc]

    def on_response_complete(self) -> None:
        """A response is done: re-arm the deadline for the next request head."""
        super().on_response_complete()  # type: ignore[misc]
        if not self.transport.is_closing():
            self._deadline.arm()

    def connection_lost(self, exc: Exception | None) -> None:
        """Cancel the deadline and any linger, then let uvicorn's protocol clean up."""
        self._deadline.cancel()
        if self._lingering is not None:
            self._lingering.cancel()
        super().connection_lost(exc)  # type: ignore[misc]

    def _body_pending(self) -> bool:
        """A request is in progress and its body has not all arrived."""
        return self.cycle is not None and bool(self.cycle.more_body)

    def _idle(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _close_idle(self) -> None:
        self.transport.close()


class BoundedH11Protocol(BoundedProtocol, H11Protocol):
    """uvicorn's h11 protocol with the header deadline and the connection bound."""
