"""The runtime's bearer token: ``RuntimeAuth``, a pure-ASGI middleware around the whole app.

With a token (``talaria runtime`` reads ``TALARIA_RUNTIME_TOKEN``), every request answers 401
``{"error": ...}`` (with ``WWW-Authenticate: Bearer``) unless it carries
``Authorization: Bearer <token>``, compared in constant time (``hmac.compare_digest``). Only
``OPEN_ROUTES`` (the probes, which say nothing of the node's sessions or models) are served
without it. The check runs before routing, so a route added later is covered with no change
here, and an unknown path without the token is a 401, not a 404 that would list what exists.
Without a token nothing is checked: the runtime is open, which ``talaria runtime`` allows only
on a loopback address (talaria/cli/runtime.py).
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

OPEN_ROUTES = frozenset({("GET", "/healthz"), ("GET", "/readyz")})
"""(method, path) served without the token: liveness and readiness probes."""


class RuntimeAuth:
    """Refuse every request but ``OPEN_ROUTES`` that lacks ``Authorization: Bearer <token>``
    (module docstring); ``token`` None or empty: let everything through."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self._token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the request's token, then hand it to the app (or answer 401)."""
        if self._token is None or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if (scope.get("method", "GET"), scope["path"]) in OPEN_ROUTES or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":  # closed before it is accepted: an HTTP 403
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": self._refusal(scope)}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _allowed(self, scope: Scope) -> bool:
        """Whether the request's first ``Authorization`` header is ``Bearer <the token>``."""
        assert self._token is not None
        credentials = _bearer(scope)
        return credentials is not None and hmac.compare_digest(credentials, self._token)

    @staticmethod
    def _refusal(scope: Scope) -> str:
        if _bearer(scope) is None:
            return "this runtime needs Authorization: Bearer <TALARIA_RUNTIME_TOKEN>"
        return "wrong runtime token (TALARIA_RUNTIME_TOKEN)"


def _bearer(scope: Scope) -> bytes | None:
    """The credentials of the request's first ``Authorization`` header if its scheme is
    ``Bearer`` (any case), else None."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, credentials = value.strip().partition(b" ")
            return credentials.strip() if scheme.lower() == b"bearer" else None
    return None
