"""The bounded protocol of core/http_edge.py over httptools (imported only when httptools is
installed: uvicorn's httptools protocol imports it)."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from talaria.core.http_edge import BoundedConfig, HeaderDeadline


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the header deadline and the connection bound."""

    def __init__(
        self,
        config: BoundedConfig,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._gate = config.gate
        self._deadline = HeaderDeadline(
            self.loop, config.header_timeout_s, self._idle, self._close_idle
        )

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self._gate.refuse_if_full(transport, len(self.connections)):
            return
        super().connection_made(transport)
        self._deadline.arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._deadline.arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline.cancel()
        super().connection_lost(exc)

    def _idle(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _close_idle(self) -> None:
        self.transport.close()
