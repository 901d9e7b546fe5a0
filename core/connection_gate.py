"""The connection bound of both servers (core/http_edge.py puts it in front of uvicorn's HTTP
protocol): past ``limit`` open connections a new one is refused at once with a 503.

Sizes, from the process's descriptor limit L (``RLIMIT_NOFILE``, soft) and the bound B
(default L/2), so that the server does not run out of descriptors (past that, ``accept``
fails and connections wait in the kernel's backlog; Python 3.11's accept loop then also logs
the failure with a traceback up to backlog times a tick):

- the listen backlog, which is also how many connections asyncio accepts in one go before any
  of them reaches a protocol: (L − B)/8, within 16 to uvicorn's 2048;
- refused connections kept half-closed (their 503 sent, their write side shut) until the
  client closes, for at most :data:`LINGER_S`, so that closing with the client's request unread
  does not reset the connection before the client has read its 503: at most (L − B)/4 of them
  at once; past that a refused connection is closed right after its 503 is written.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time

log = logging.getLogger("talaria.edge")

LINGER_S = 1.0
"""The longest a half-closed connection (refused here, or answered before its body arrived:
core/http_edge.py) waits for the client to close (s). nginx waits up to 30 s
(``lingering_time``; docs/sources.md §10); a client that reads its answer closes within
milliseconds, and a short wait keeps descriptors free under a flood."""
REFUSAL_LOG_EVERY_S = 60.0
"""At most one warning about refused connections per this many seconds (per gate)."""


def descriptor_limit() -> int:
    """The process's descriptor limit (``RLIMIT_NOFILE``, soft)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def default_max_connections() -> int:
    """Half the descriptor limit: the other half stays for the store, the runtimes, peers,
    logs, and connections accepted but not yet answered or refused."""
    return max(1, descriptor_limit() // 2)


def accept_backlog(max_connections: int) -> int:
    """An eighth of the descriptors ``max_connections`` leaves free, within 16 to 2048."""
    return max(16, min(2048, (descriptor_limit() - max_connections) // 8))


class Gate:
    """One server's bound: :meth:`refuse_if_full` when a connection is made."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.linger_budget = max(0, (descriptor_limit() - limit) // 4)
        self.lingering: set[RefusedConnection] = set()
        self._warned_at = -REFUSAL_LOG_EVERY_S

    def refuse_if_full(self, transport: asyncio.Transport, open_connections: int) -> bool:
        """With ``limit`` connections open already, hand ``transport`` to a
        :class:`RefusedConnection` protocol and say so: the caller's protocol is then never used."""
        if open_connections < self.limit:
            return False
        refused = RefusedConnection(self)
        transport.set_protocol(refused)
        refused.connection_made(transport)
        now = time.monotonic()
        if now - self._warned_at >= REFUSAL_LOG_EVERY_S:
            self._warned_at = now
            log.warning(
                "refusing connections with 503: %d are open (the limit, "
                "TALARIA_MAX_CONNECTIONS); at most one such warning a minute",
                self.limit,
            )
        return True


def refusal_response(limit: int) -> bytes:
    """The 503 a refused connection gets, before its request is read."""
    body = json.dumps(
        {
            "error": {
                "message": f"Too many open connections (limit {limit}). Retry shortly.",
                "type": "server_error",
                "param": None,
                "code": "too_many_connections",
            }
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "retry-after: 1\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


class RefusedConnection(asyncio.Protocol):
    """A connection over the bound: its 503 is written; then, within the gate's linger budget,
    its write side is shut and it is closed when the client closes (or after
    :data:`LINGER_S`), what it sends being discarded; past the budget, it is closed at once."""

    def __init__(self, gate: Gate) -> None:
        self._gate = gate
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Write the 503, then linger half-closed (within the budget) or close at once."""
        transport.write(refusal_response(self._gate.limit))
        if len(self._gate.lingering) >= self._gate.linger_budget or not transport.can_write_eof():
            transport.close()
            return
        self._gate.lingering.add(self)
        transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        """Discard what the client sends: the request of a refused connection is not read."""

    def eof_received(self) -> bool:
        """The client closed: False, so the transport closes too."""
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        """Leave the gate's lingering set and cancel the linger timer."""
        self._gate.lingering.discard(self)
        if self._timer is not None:
            self._timer.cancel()
