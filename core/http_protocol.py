"""The bounded HTTP protocol of core/http_edge.py: uvicorn's protocol with the header deadline,
the connection bound and the lingering close (http_edge.py's docstring says why each), mixed in
ahead of uvicorn's h11 protocol here and of its httptools one in core/http_edge_httptools.py.
It reads its server's bounds through ``EdgeLimits`` (``http_edge.BoundedConfig`` has them), so
neither protocol module imports the config's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol, cast

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from talaria.core.connection_gate import LINGER_S, Gate


class EdgeLimits(Protocol):
    """What the bounded protocol reads of its server's config (``http_edge.BoundedConfig``)."""

    gate: Gate
    header_timeout_s: float


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
        config: EdgeLimits,
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
