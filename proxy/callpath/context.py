"""What every route reaches through ``request.app.state``: the proxy's parts, as the app's
services started them (proxy/edge/services.py ``context_of``). A stateful dialect's own
service is not here: its routes reach it by its name (proxy/dialects/base.py ``service_of``).
Plus small response helpers."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import msgspec
from fastapi import Request
from fastapi.responses import Response

from talaria.core.loop_watchdog import LoopWatchdog
from talaria.proxy.callpath.auth import Authenticator
from talaria.proxy.callpath.bounds import check_structure
from talaria.proxy.callpath.gateway import Gateway
from talaria.proxy.callpath.keeper import SessionKeeper
from talaria.proxy.callpath.limiter import RateLimiter
from talaria.proxy.callpath.shutdown import Shutdown
from talaria.proxy.cluster.forward import Cluster
from talaria.proxy.cluster.trust import BODY_SHA256, body_digest
from talaria.proxy.contract.arrival import arrival_of
from talaria.proxy.contract.errors import ApiError, bad_request
from talaria.proxy.contract.metrics import ProxyMetrics
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.placement.loop import PlacementLoop
from talaria.proxy.runtimes.pool import RuntimePool
from talaria.proxy.store.repository import SqlStore
from talaria.proxy.store.service import StoreService
from talaria.proxy.store.writer import BatchWriter


@dataclass
class ProxyContext:
    """The proxy's parts, built by the lifespan and reached by every route."""

    settings: ProxySettings
    gateway: Gateway
    """The call path's gateway: ``open_call``."""
    pool: RuntimePool
    """The runtimes by name, their models, statuses and drains (proxy/runtimes/pool.py)."""
    keeper: SessionKeeper
    """The sessions between calls: hints and ends (proxy/callpath/keeper.py)."""
    store: SqlStore
    writer: BatchWriter
    metrics: ProxyMetrics
    auth: Authenticator
    stored: StoreService
    shutdown: Shutdown
    watchdog: LoopWatchdog
    """Watches the event loop for stalls (/healthz)."""
    cluster: Cluster | None = None
    """This replica's peers, when several share the database (proxy/cluster/)."""
    placement: PlacementLoop | None = None
    """The placement controller, with a model library (proxy/placement/loop.py)."""
    limits: RateLimiter | None = None
    """The API keys' rate limits (proxy/callpath/limiter.py)."""


def context(request: Request) -> ProxyContext:
    ctx: ProxyContext = request.app.state.talaria
    return ctx


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps(data, separators=(",", ":"), default=str).encode()
    return Response(body, status, headers=headers, media_type="application/json")


async def read_json(request: Request, max_bytes: int) -> Any:
    """The body as JSON: 413 as soon as it passes ``max_bytes`` (a declared length, or the bytes
    read so far of a chunked body: it is never read whole first), 400 when it is not JSON or
    nests deeper than the parser can follow."""
    return parse_json(await read_bytes(request, max_bytes))


async def read_bytes(request: Request, max_bytes: int) -> bytes:
    """The body's bytes (413 past ``max_bytes``, as :func:`read_json`). A peer's forward must
    come with the body it signed (proxy/cluster/trust.py; its digest is the request's
    ``Arrival.body_sha256``): 400 otherwise."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    body = b"".join(chunks)
    signed = arrival_of(request).body_sha256
    if signed is not None and body_digest(body) != signed:
        raise bad_request(
            f"The body does not match its {BODY_SHA256}: "
            "x-talaria-* headers are internal to Talaria's replicas.",
            code="internal_header",
        )
    return body


_DECODER = msgspec.json.Decoder()
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_json(body: bytes) -> Any:
    """The body parsed by msgspec (one pass, in C; integers exact at any size, as Python's own
    parser reads them): a 400 for anything but strict JSON (RFC 8259: no NaN or Infinity, no
    control characters in strings), for invalid UTF-8 or a lone surrogate escape (so every
    string the proxy holds encodes to UTF-8: token estimates, the store), for nesting past
    what the parser follows, and, before it is parsed, for a body of more objects, arrays and
    members than proxy/callpath/bounds.py ``MAX_BODY_STRUCTURE``."""
    check_structure(body)
    try:
        return _DECODER.decode(body)
    except RecursionError as exc:
        raise bad_request("The request body nests too deeply to be read.") from exc
    except msgspec.DecodeError as exc:
        if _SURROGATE_ESCAPE.search(body):  # only on the error path: msgspec says "truncated"
            raise bad_request(
                "The request body holds a string that is not Unicode text (a lone surrogate "
                f"escape): {exc}.",
                code="invalid_value",
            ) from exc
        raise bad_request(f"The request body is not valid JSON: {exc}") from exc


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413, f"The request body is larger than {max_bytes} bytes.", code="request_too_large"
    )
