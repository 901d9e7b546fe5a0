"""The bounded protocol of core/http_protocol.py over httptools (imported only when httptools is
installed: uvicorn's httptools protocol imports it)."""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from talaria.core.http_protocol import BoundedProtocol


class BoundedHttpToolsProtocol(BoundedProtocol, HttpToolsProtocol):
    """uvicorn's httptools protocol with the header deadline and the connection bound."""
