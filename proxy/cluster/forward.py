"""Forwarding a call to the replica that owns its session, and asking the peers about a
session this replica does not hold.

A forwarded request is the client's: same method, path, query and headers (its credentials
included: the owner authenticates it again), the body's bytes as they came, plus the signed
internal headers of trust.py: who forwarded it (a forwarded request is never forwarded again)
and the request id, which the owner keeps, so both replicas log and record the same id. The
owner's answer streams back unchanged: status, headers, body bytes (SSE included).

Every hop has a timeout (docs/operations.md, "Bounds, quotas and timeouts"):

- connecting: :data:`CONNECT_TIMEOUT_S`. An owner that cannot be reached (connection refused
  or timed out) is left out (membership) and the next owner is tried: nothing was sent, so
  nothing can run twice;
- sending the request and waiting for the answer: as a call's read (below), and the relay
  watch;
- a hint, an end or an admin end asked of the peers: :data:`PEER_READ_TIMEOUT_S` for the
  answer (a peer that does not answer is skipped);
- a call: ``replica_read_timeout_s`` between two bytes of the answer (a long non-streaming
  call sends nothing until it is done), while the watch of relays.py ends the relay as soon
  as its owner leaves the live set or stops answering its /healthz.

A call that fails once it was sent (the owner broke the connection, timed out, or is gone)
gets a 503 ``replica_unavailable`` with ``Retry-After``; once the owner's answer has begun, a
stream ends with an error event in the API's format instead. The call may or may not have run
there: only the client may decide to send it again. The drain aborts every relay with the
shutdown's 503 (:meth:`Cluster.abort_relays`).

The client is aiohttp's on kept-alive connections (as the runtime hop's, proxy/runtimes/http.py:
a fraction of httpx's CPU per call). The request goes out with the path and query exactly as
they came (signed as sent), and nothing is added or decoded on the way: no compression is
asked for, and the owner's body passes through as its bytes.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import yarl
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from talaria.core.http_edge import CLIENT_KEEP_ALIVE_S
from talaria.proxy.cluster import trust
from talaria.proxy.cluster.membership import Membership
from talaria.proxy.cluster.owner import placed_by_ingress
from talaria.proxy.cluster.relays import Relay, Relays, owner_gone
from talaria.proxy.contract.arrival import arrival_of
from talaria.proxy.contract.calls import OVERHEAD_HEADER, SHUTDOWN, RuntimeClock
from talaria.proxy.contract.envelope import Envelope, envelope_of
from talaria.proxy.contract.errors import ApiError

log = logging.getLogger("talaria.proxy.cluster")

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}
NOT_FORWARDED = HOP_BY_HOP | set(trust.INTERNAL)
CONNECT_TIMEOUT_S = 2.0
PEER_READ_TIMEOUT_S = 3.0
NOT_ADDED = ("Accept-Encoding", "User-Agent", "Content-Type")
"""Headers aiohttp would add of its own: the client's are sent as they came, or none."""
CONNECT_FAILED = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
"""Nothing was sent: the next owner may serve the call."""


class Forwarded(Exception):
    """The owner replica answered this request: the route returns ``response`` as is."""

    def __init__(self, response: Response) -> None:
        super().__init__("forwarded")
        self.response = response


def was_forwarded(request: Request) -> bool:
    """Whether a peer forwarded this request (its signature checked: proxy/edge/http.py)."""
    return arrival_of(request).forwarded


def _timeout(read_s: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=read_s)


class Cluster:
    """This replica's view of its peers, and the HTTP client that reaches them."""

    def __init__(self, membership: Membership, secret: str, read_timeout_s: float) -> None:
        self.membership = membership
        self.secret = secret
        self._call_timeout = _timeout(read_timeout_s)
        self._peer_timeout = _timeout(PEER_READ_TIMEOUT_S)
        self._session: aiohttp.ClientSession | None = None
        self.relays = Relays(membership, self._http)

    def _http(self) -> aiohttp.ClientSession:
        """The HTTP session to the peers, made on first use (inside the running loop)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self._peer_timeout,
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=CLIENT_KEEP_ALIVE_S),
                auto_decompress=False,
                skip_auto_headers=NOT_ADDED,
            )
        return self._session

    @property
    def name(self) -> str:
        """This replica's name among its peers."""
        return self.membership.name

    def start(self) -> None:
        """Start watching the owners of open relays."""
        self.relays.start()

    async def close(self) -> None:
        """Stop the relay watch and close the HTTP client to the peers."""
        await self.relays.stop()
        if self._session is not None:
            await self._session.close()

    def abort_relays(self) -> int:
        """The drain: every call relayed now gets the shutdown's 503; returns how many."""
        return self.relays.abort_all(
            lambda: ApiError(
                503, SHUTDOWN, type="server_error", code="replica_unavailable", retry_after_s=1.0
            )
        )

    async def forward(self, request: Request, content: bytes, key: str | None) -> Response | None:
        """The owner's answer to the request (its body: ``content``), when ``key``'s owner is
        another replica; None when this replica serves the request (it owns the key, the
        ingress placed it here, the request was forwarded here, or no key)."""
        if key is None or placed_by_ingress(key) or was_forwarded(request):
            return None
        while (target := self.membership.owner_of(key)) is not None:
            name, url = target
            relay = self.relays.open(name, url)
            sent = time.perf_counter()
            try:
                upstream = await self._open(request, relay, content)
            except BaseException:
                self.relays.close(relay)
                raise
            if upstream is None:
                self.relays.close(relay)
                continue
            # The owner stands for the runtime in this replica's overhead, less the owner's
            # own overhead before its headers (x-talaria-overhead-ms, proxy/edge/http.py).
            owner_overhead_s = _float(upstream.headers.get(OVERHEAD_HEADER)) / 1e3
            clock = RuntimeClock(started=sent + owner_overhead_s)
            arrival_of(request).runtime_clock = clock
            return StreamingResponse(
                self._body(_dialect(request), upstream, relay, clock),
                status_code=upstream.status,
                headers=_headers(upstream, name),
            )
        return None

    async def _open(
        self, request: Request, relay: Relay, content: bytes
    ) -> aiohttp.ClientResponse | None:
        """The owner's answer (its body to follow); None when it could not be reached."""
        try:
            async with relay.waiting():
                return await self._send(request, relay.url, content, self._call_timeout)
        except CONNECT_FAILED as exc:
            log.warning("replica %s unreachable (%r): choosing the next owner", relay.target, exc)
            self.membership.mark_down(relay.target)
            return None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _failed(relay, exc) from exc

    async def _body(
        self,
        dialect: Envelope,
        upstream: aiohttp.ClientResponse,
        relay: Relay,
        clock: RuntimeClock,
    ) -> AsyncIterator[bytes]:
        """The owner's body, chunk by chunk. A stream (SSE) is passed on in whole events,
        so that when the relay fails it can end with an error event of its own; any other
        body is cut off (the exception breaks the client's connection: no truncated 200)."""
        chunks = upstream.content.iter_any()
        events = upstream.headers.get("content-type", "").startswith("text/event-stream")
        held = b""
        try:
            while True:
                try:
                    async with relay.waiting():
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
                    error = exc if isinstance(exc, ApiError) else _failed(relay, exc)
                    log.warning("relay to %s ended: %s", relay.target, error.message)
                    if not events:
                        raise
                    yield dialect.stream_error(error)
                    return
                if not events:
                    yield chunk
                    continue
                held += chunk
                end = held.rfind(b"\n\n") + 2
                if end > 1:
                    yield held[:end]
                    held = held[end:]
            if held:
                yield held
        finally:
            clock.ended = time.perf_counter()
            self.relays.close(relay)
            upstream.release()  # back to the pool if it was read to its end, else closed

    async def ask_peers(
        self, request: Request, body: Any, answered: Callable[[int, Any], bool]
    ) -> Response | None:
        """Send the request to each reachable peer in turn until one's answer is ``answered``
        (status, JSON): for a session this replica does not hold (a hint, an end). None if no
        peer has it, or the request was itself forwarded."""
        if was_forwarded(request):
            return None
        content = b"" if body is None else json.dumps(body).encode()
        for name, url in sorted(self.membership.reachable().items()):
            try:
                upstream = await self._send(request, url, content, self._peer_timeout)
                try:
                    payload = await upstream.read()
                finally:
                    upstream.release()
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning("replica %s did not answer (%r)", name, exc)
                continue
            try:
                parsed = json.loads(payload)
            except ValueError:
                parsed = None
            if answered(upstream.status, parsed):
                headers = _headers(upstream, name)
                return Response(payload, upstream.status, headers=headers)
        return None

    async def _send(
        self, request: Request, url: str, content: bytes, timeout: aiohttp.ClientTimeout
    ) -> aiohttp.ClientResponse:
        """Send the request to ``url``, its path and query as they came, signed (trust.py);
        the answer's headers (its body to follow)."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED}
        raw_path = request.scope.get("raw_path") or request.scope["path"].encode()
        path = raw_path.decode("latin-1")
        query = request.scope.get("query_string", b"").decode("latin-1")
        forward = trust.Forward(
            arrival_of(request).request_id, self.name, int(time.time()), trust.body_digest(content)
        )
        headers.update(trust.sign(self.secret, request.method, path, query, forward))
        target = yarl.URL(url + path + (f"?{query}" if query else ""), encoded=True)
        return await self._http().request(
            request.method, target, data=content, headers=headers, timeout=timeout
        )


def _failed(relay: Relay, exc: BaseException) -> ApiError:
    return owner_gone(relay.target, f"failed: {exc.__class__.__name__}")


def _dialect(request: Request) -> Envelope:
    """The dialect of the route the request matched (its stream's error event): the app
    keeps the registry in ``app.state.dialects`` (proxy/edge/app.py)."""
    return envelope_of(request.scope, request.app.state.dialects)


def _headers(upstream: aiohttp.ClientResponse, replica: str) -> dict[str, str]:
    """The owner's headers, less hop-by-hop ones, its x-request-id (the same id: this replica
    adds its own) and its overhead (this replica's counts it in), plus which replica
    answered."""
    kept = {
        k: v
        for k, v in upstream.headers.items()
        if k.lower() not in HOP_BY_HOP and k.lower() not in ("x-request-id", OVERHEAD_HEADER)
    }
    kept["x-talaria-replica"] = replica
    return kept


def _float(value: str | None) -> float:
    """A header's number; 0 for none or one that does not parse."""
    try:
        number = float(value) if value is not None else 0.0
    except ValueError:
        return 0.0
    return number if math.isfinite(number) and number > 0 else 0.0
