"""What every request of the proxy meets around its route: an id (``x-request-id``), the
trust check of Talaria's internal headers (proxy/cluster/trust.py), the count of responses by
route and status, and errors in the envelope of the dialect whose route it addressed
(proxy/dialects/base.py), with the OpenAPI document's request models."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from talaria.core.body_deadline import BodyTimeout
from talaria.proxy.callpath.context import json_response
from talaria.proxy.cluster import trust
from talaria.proxy.cluster.forward import Forwarded
from talaria.proxy.contract.arrival import Arrival, arrival_in
from talaria.proxy.contract.calls import OVERHEAD_HEADER, CallAbandoned
from talaria.proxy.contract.envelope import envelope_of
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.dialects.base import Dialect, components

log = logging.getLogger("talaria.proxy")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class RequestIdMiddleware:
    """Gives every request an id (its ``Arrival``'s, proxy/contract/arrival.py) and every
    response the
    ``x-request-id`` header — errors and streams included — and counts every response in
    ``talaria_requests_total`` by route (the path template; "unmatched" for unknown paths,
    so a scanner cannot grow the label set) and status. A request with Talaria's internal
    headers is refused (400) unless it is a peer replica's signed forward (proxy/cluster/
    trust.py), which keeps the peer's request id (``Arrival.forwarded_by``)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        arrival = arrival_in(scope)
        try:
            forward = _forward(scope)
            refused = None
        except trust.ForgedForward as exc:
            forward, refused = None, ApiError(400, str(exc), code="internal_header")
        request_id = forward.request_id if forward is not None else uuid.uuid4().hex
        arrival.request_id = request_id
        if forward is not None:
            arrival.forwarded_by, arrival.body_sha256 = forward.forwarded_by, forward.body_sha256
        header = (b"x-request-id", request_id.encode())
        arrived = time.perf_counter()

        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                overhead = _overhead_s(arrival, arrived)
                message["headers"] = [
                    *message.get("headers", []),
                    header,
                    (OVERHEAD_HEADER.encode(), f"{overhead * 1e3:.3f}".encode()),
                ]
                _count(scope, message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                _observe_overhead(scope, _overhead_s(arrival, arrived))
            await send(message)

        if refused is not None:  # before anything runs
            await _error_response(scope, refused)(scope, receive, send_with_id)
            return
        try:
            await self.app(scope, receive, send_with_id)
        except CallAbandoned:  # waiting for a whole reply: its call was stopped
            log.warning(
                "client went away while its call ran (stopped, recorded cancelled): %s %s "
                "(request %s)",
                scope["method"],
                scope["path"],
                request_id,
            )
            _count(scope, CLIENT_CLOSED)
        except ClientDisconnect:  # the client left mid-body: no one to answer, not our error
            log.warning(
                "client went away before its request body arrived: %s %s (request %s)",
                scope["method"],
                scope["path"],
                request_id,
            )
            _count(scope, CLIENT_CLOSED)
        except Exception as exc:  # an error no handler answered: answered here, with the id
            if started:
                raise
            await _error_response(scope, _unexpected(exc))(scope, receive, send_with_id)


CLIENT_CLOSED = 499
"""The status ``talaria_requests_total`` counts for a client that disconnected before its
request's body arrived, or while the call it waited on whole ran (nginx's "client closed
request"; nothing is sent)."""


def _forward(scope: Scope) -> trust.Forward | None:
    """The peer's verified forward; None for a client's request; ``trust.ForgedForward``."""
    found = trust.internal_headers(scope["headers"])
    if not found:
        return None
    ctx = getattr(scope["app"].state, "talaria", None)
    cluster = ctx.cluster if ctx is not None else None
    path = scope.get("raw_path") or scope["path"].encode()
    return trust.verify(
        found,
        scope["method"],
        path.decode("latin-1"),
        scope.get("query_string", b"").decode("latin-1"),
        cluster.secret if cluster is not None else None,
        time.time(),
    )


def _unexpected(exc: Exception) -> ApiError:
    """The error for an exception nothing else handled. A RecursionError comes from input
    nested deeper than the parsers follow: the client's 400. Anything else is logged: 500."""
    if isinstance(exc, RecursionError):
        return ApiError(400, "The request nests too deeply to be read.")
    log.exception("unexpected error", exc_info=exc)
    return ApiError(500, "Internal error; see the proxy's log.", type="server_error")


def _overhead_s(arrival: Arrival, arrived: float) -> float:
    now = time.perf_counter()
    clock = arrival.runtime_clock
    return max(0.0, now - arrived - (clock.elapsed(now) if clock is not None else 0.0))


def _observe_overhead(scope: Scope, seconds: float) -> None:
    ctx = getattr(scope["app"].state, "talaria", None)
    if ctx is None:  # before start-up finished
        return
    route = scope.get("route")
    ctx.metrics.overhead.labels(getattr(route, "path", None) or "unmatched").observe(seconds)


def _count(scope: Scope, status: int) -> None:
    ctx = getattr(scope["app"].state, "talaria", None)
    if ctx is None:  # before start-up finished
        return
    route = scope.get("route")
    path = getattr(route, "path", None) or "unmatched"
    ctx.metrics.requests.labels(path, str(status)).inc()


def _error_response(scope: Scope, error: ApiError) -> Response:
    """The error in the envelope of the dialect whose route the request addressed
    (proxy/contract/envelope.py ``envelope_of``): Anthropic's on the Messages routes, OpenAI's
    everywhere else."""
    dialects: tuple[Dialect, ...] = getattr(scope["app"].state, "dialects", ())
    status, body = envelope_of(scope, dialects).error(error)
    return json_response(body, status, error.headers())


def declare_request_models(app: FastAPI) -> None:
    """The OpenAPI document with the dialects' nested request models in its components (each
    route declares its body's top level: proxy/dialects/base.py ``request_body``)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            dialects: tuple[Dialect, ...] = app.state.dialects
            schemas.update(components(m for d in dialects for m in d.models))
        return app.openapi_schema or document

    app.openapi = openapi  # type: ignore[method-assign]


def install_error_handlers(app: FastAPI) -> None:
    """Every error answered in its dialect's envelope, with its status."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> Response:
        return _error_response(request.scope, exc)

    @app.exception_handler(BodyTimeout)
    async def body_timeout(request: Request, exc: BodyTimeout) -> Response:
        error = ApiError(408, str(exc), code="request_timeout")
        response = _error_response(request.scope, error)
        response.headers["connection"] = "close"  # the rest of the body is not waited for
        return response

    @app.exception_handler(Forwarded)
    async def forwarded(request: Request, exc: Forwarded) -> Response:
        return exc.response

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first["loc"] if p not in ("body", "query", "path"))
        error = ApiError(422, f"Invalid request: {param}: {first['msg']}", param=param or None)
        return _error_response(request.scope, error)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        error = ApiError(exc.status_code, str(exc.detail), type=kind)
        return _error_response(request.scope, error)
