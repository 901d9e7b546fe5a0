"""Forwarding a call to the replica that owns its session, and asking the peers about a
session this replica does not hold.

A forwarded request is the client's: same method, path, query and headers (its credentials
included: the owner authenticates it again), the body's bytes as they came, plus the signed
internal headers of trust.py: who forwarded it (a forwarded request is never forwarded again)
and the request id, which the owner keeps, so both replicas log and record the same id. The owner's
answer streams back unchanged: status, headers, body bytes (SSE included).

If the owner cannot be reached (connection refused or timed out), it is left out (membership)
and the next owner is tried: nothing was sent, so nothing can run twice. If it fails after the
request was sent, the client gets a 502 with ``Retry-After``: the call may or may not have run
there, and only the client may decide to send it again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from talaria.proxy.cluster import trust
from talaria.proxy.cluster.membership import Membership
from talaria.proxy.errors import ApiError

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
RETRY_AFTER_S = 1.0


class Forwarded(Exception):
    """The owner replica answered this request: the route returns ``response`` as is."""

    def __init__(self, response: Response) -> None:
        super().__init__("forwarded")
        self.response = response


def was_forwarded(request: Request) -> bool:
    """Whether a peer forwarded this request (its signature checked: proxy/app.py)."""
    return getattr(request.state, "forward", None) is not None


class Cluster:
    """This replica's view of its peers, and the HTTP client that reaches them."""

    def __init__(self, membership: Membership, secret: str, connect_timeout_s: float = 2.0) -> None:
        self.membership = membership
        self.secret = secret
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=connect_timeout_s, read=None, write=60.0, pool=10.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )

    @property
    def name(self) -> str:
        return self.membership.name

    async def close(self) -> None:
        await self._client.aclose()

    async def forward(self, request: Request, body: Any, key: str | None) -> Response | None:
        """The owner's answer, when ``key``'s owner is another replica; None when this replica
        serves the request (it owns the key, the request was forwarded here, or no key)."""
        if key is None or was_forwarded(request):
            return None
        raw = getattr(request.state, "body", None)
        content = raw if isinstance(raw, bytes) else json.dumps(body).encode()
        while (target := self.membership.owner_of(key)) is not None:
            name, url = target
            try:
                upstream = await self._send(request, url, content)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                log.warning("replica %s unreachable (%r): choosing the next owner", name, exc)
                self.membership.mark_down(name)
                continue
            except httpx.HTTPError as exc:
                raise ApiError(
                    502,
                    f"Replica {name}, which holds this session, failed: {exc.__class__.__name__}. "
                    "The call may not have run; retry it.",
                    type="server_error",
                    code="replica_failed",
                    retry_after_s=RETRY_AFTER_S,
                ) from exc
            return _relay(upstream, name)
        return None

    async def ask_peers(
        self, request: Request, body: Any, answered: Callable[[int, Any], bool]
    ) -> Response | None:
        """Send the request to each live peer in turn until one's answer is ``answered``
        (status, JSON): for a session this replica does not hold (a hint, an end). None if no
        peer has it, or the request was itself forwarded."""
        if was_forwarded(request):
            return None
        content = b"" if body is None else json.dumps(body).encode()
        for name, url in sorted(self.membership.peers.items()):
            try:
                upstream = await self._send(request, url, content)
                payload = await upstream.aread()
            except httpx.HTTPError as exc:
                log.warning("replica %s did not answer (%r)", name, exc)
                continue
            try:
                parsed = json.loads(payload)
            except ValueError:
                parsed = None
            if answered(upstream.status_code, parsed):
                headers = _headers(upstream, name)
                return Response(payload, upstream.status_code, headers=headers)
        return None

    async def _send(self, request: Request, url: str, content: bytes) -> httpx.Response:
        """Send the request to ``url``, signed (trust.py); the answer's headers."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED}
        outgoing = self._client.build_request(
            request.method,
            url + request.url.path,
            params=request.query_params,
            headers=headers,
            content=content,
        )
        path, _, query = outgoing.url.raw_path.decode("latin-1").partition("?")
        forward = trust.Forward(
            request.state.request_id, self.name, int(time.time()), trust.body_digest(content)
        )
        outgoing.headers.update(trust.sign(self.secret, request.method, path, query, forward))
        return await self._client.send(outgoing, stream=True)


def _headers(upstream: httpx.Response, replica: str) -> dict[str, str]:
    """The owner's headers, less hop-by-hop ones and its x-request-id (the same id: this
    replica adds its own), plus which replica answered."""
    kept = {
        k: v
        for k, v in upstream.headers.items()
        if k.lower() not in HOP_BY_HOP and k.lower() != "x-request-id"
    }
    kept["x-talaria-replica"] = replica
    return kept


def _relay(upstream: httpx.Response, replica: str) -> Response:
    return StreamingResponse(
        upstream.aiter_raw(),
        status_code=upstream.status_code,
        headers=_headers(upstream, replica),
        background=BackgroundTask(upstream.aclose),
    )
