"""The trust boundary between replicas: which requests are a peer's forwards. Pure functions,
no I/O.

A replica that forwards a request adds five internal headers (:data:`INTERNAL`):
``x-talaria-forwarded-by`` (its name), ``x-talaria-request-id``, ``x-talaria-timestamp``
(Unix seconds, an integer), ``x-talaria-body-sha256`` (hex SHA-256 of the body it sends) and

    x-talaria-signature = hex HMAC-SHA256(secret, "talaria-forward-v1" ‖ LF ‖ method ‖ LF ‖
                          path ‖ LF ‖ query ‖ LF ‖ request id ‖ LF ‖ forwarded-by ‖ LF ‖
                          timestamp ‖ LF ‖ body sha256)

where ``secret`` is ``TALARIA_CLUSTER_SECRET`` (the same on every replica), ``path`` and
``query`` the raw request target as sent (percent-encoding kept; the query without its
``?``), and LF a newline (no header value can hold one, so the fields cannot run together).

A receiving replica honours the request id and skips forwarding only when every internal
header is there, the signature matches (constant-time compare), and ``|now − timestamp|`` ≤
:data:`MAX_AGE_S` (which bounds a replay; clocks of the replicas must agree within it). The
body is checked against ``x-talaria-body-sha256`` when it is read (proxy/callpath/context.py). Any
internal header on a request that fails this — on a lone proxy, any at all — refuses the
request (:class:`ForgedForward`, a 400): a client can never pose as a peer.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass

FORWARDED_BY = "x-talaria-forwarded-by"
REQUEST_ID = "x-talaria-request-id"
TIMESTAMP = "x-talaria-timestamp"
BODY_SHA256 = "x-talaria-body-sha256"
SIGNATURE = "x-talaria-signature"
INTERNAL = (FORWARDED_BY, REQUEST_ID, TIMESTAMP, BODY_SHA256, SIGNATURE)
_INTERNAL_RAW = frozenset(name.encode() for name in INTERNAL)
MAX_AGE_S = 60.0
"""How far a forward's timestamp may be from the receiver's clock, either way (s)."""
_CONTEXT = "talaria-forward-v1"
MAX_REQUEST_ID = 64


class ForgedForward(Exception):
    """A request carries internal headers without a valid signature (the message says why)."""


@dataclass(frozen=True)
class Forward:
    """A peer's forward, as its signed headers describe it."""

    request_id: str
    forwarded_by: str
    timestamp: int
    body_sha256: str


def body_digest(body: bytes) -> str:
    """Hex SHA-256 of ``body`` (the ``x-talaria-body-sha256`` value)."""
    return hashlib.sha256(body).hexdigest()


def signature(secret: str, method: str, path: str, query: str, forward: Forward) -> str:
    """The signature of the module docstring."""
    fields = (
        _CONTEXT,
        method.upper(),
        path,
        query,
        forward.request_id,
        forward.forwarded_by,
        str(forward.timestamp),
        forward.body_sha256,
    )
    message = "\n".join(fields).encode("latin-1")
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign(secret: str, method: str, path: str, query: str, forward: Forward) -> dict[str, str]:
    """The internal headers of ``forward`` (sent as ``method path?query``)."""
    return {
        FORWARDED_BY: forward.forwarded_by,
        REQUEST_ID: forward.request_id,
        TIMESTAMP: str(forward.timestamp),
        BODY_SHA256: forward.body_sha256,
        SIGNATURE: signature(secret, method, path, query, forward),
    }


def internal_headers(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The internal headers among raw ASGI ``headers`` (name → value): one pass over the
    names, nothing hashed; empty for a client's request (the usual case)."""
    return {
        name.decode(): value.decode("latin-1") for name, value in headers if name in _INTERNAL_RAW
    }


def verify(
    found: dict[str, str], method: str, path: str, query: str, secret: str | None, now: float
) -> Forward:
    """The forward that the internal headers ``found`` (non-empty) describe, once verified;
    ``ForgedForward`` when they fail (module docstring), or ``secret`` is None (a lone proxy)."""
    named = ", ".join(n for n in INTERNAL if n in found)
    if secret is None:
        raise ForgedForward(f"{named} is internal to Talaria's replicas; a client may not send it.")
    missing = [n for n in INTERNAL if n not in found]
    if missing:
        raise ForgedForward(f"{named} is internal to Talaria's replicas: {missing[0]} is missing.")
    stamp = found[TIMESTAMP]
    if not stamp.isdigit() or len(stamp) > 12:
        raise ForgedForward(f"{named} is internal to Talaria's replicas: bad {TIMESTAMP}.")
    request_id = found[REQUEST_ID]
    if not (request_id.isascii() and request_id.isalnum() and len(request_id) <= MAX_REQUEST_ID):
        raise ForgedForward(f"{named} is internal to Talaria's replicas: bad {REQUEST_ID}.")
    forward = Forward(request_id, found[FORWARDED_BY], int(stamp), found[BODY_SHA256])
    expected = signature(secret, method, path, query, forward)
    if not hmac.compare_digest(expected.encode(), found[SIGNATURE].encode("latin-1")):
        raise ForgedForward(f"{named} is internal to Talaria's replicas: wrong {SIGNATURE}.")
    if abs(now - forward.timestamp) > MAX_AGE_S:
        raise ForgedForward(
            f"{named} is internal to Talaria's replicas: the signature is stale "
            f"(more than {MAX_AGE_S:g} s from this replica's clock)."
        )
    return forward
