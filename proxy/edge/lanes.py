"""Call lanes: the LLM calls' own way through the proxy's ASGI app, around FastAPI's routing.

Every request to FastAPI passes its middleware stack (server errors, telemetry, a body limit,
exception handlers, an exit stack for dependencies) and its router (a scan of every route,
then ``request_response``, dependency solving, the endpoint). For the dialects' call routes
(``POST /v1/chat/completions`` and the like: an endpoint that takes the ``Request`` and
returns a ``Response``) none of it does anything the proxy needs, and it cost a third of the
proxy's own CPU per call (docs/proxy-overhead.md, "Call lanes"). A lane is one dictionary
lookup by path, then the same edge middleware (proxy/edge/http.py, core/body_deadline.py), the
endpoint, and the app's exception handlers for what it raises, exactly as FastAPI would.

Everything else (other methods on those paths, other routes, a ``root_path``) goes through
FastAPI as before; the routes stay registered there, so the OpenAPI document is unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Handler = Callable[[Request, Any], Response | Awaitable[Response]]


class ProxyApp(FastAPI):
    """FastAPI, with the call routes on lanes (module docstring) once ``open_lanes`` ran."""

    lanes: Mapping[str, ASGIApp] = {}
    """Path → the lane serving ``POST`` on it."""

    def open_lanes(self, routes: Iterable[BaseRoute], edge: Callable[[ASGIApp], ASGIApp]) -> None:
        """Serve each of ``routes`` that can take a lane (``lane_route``) on one, wrapped in
        ``edge`` (the middleware FastAPI's stack gives it too)."""
        self.lanes = {
            route.path: edge(_Lane(route, self.exception_handlers))
            for route in routes
            if isinstance(route, APIRoute) and lane_route(route)
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lane = (
            self.lanes.get(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path")
            else None
        )
        if lane is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        await lane(scope, receive, send)


def lane_route(route: APIRoute) -> bool:
    """Whether a lane can serve ``route``: ``POST`` on a path without parameters, to a
    coroutine endpoint whose one parameter is the request (nothing for FastAPI to solve)."""
    dependant = route.dependant
    solved = (
        dependant.path_params,
        dependant.query_params,
        dependant.header_params,
        dependant.cookie_params,
        dependant.body_params,
        dependant.dependencies,
    )
    return (
        "POST" in (route.methods or ())
        and not route.param_convertors
        and inspect.iscoroutinefunction(route.endpoint)
        and dependant.request_param_name is not None
        and not any(solved)
    )


class _Lane:
    """One call route's endpoint as an ASGI app: what it raises goes to the app's handler
    for the nearest class in the exception's MRO (Starlette's rule); none: raised on."""

    def __init__(self, route: APIRoute, handlers: Mapping[Any, Handler]) -> None:
        self._route = route
        self._handlers = handlers  # the app's own dict: handlers added later count too

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["route"], scope["endpoint"] = self._route, self._route.endpoint
        request = Request(scope, receive, send)
        try:
            response = await self._route.endpoint(request)
        except Exception as exc:
            handler = _handler(self._handlers, exc)
            if handler is None:
                raise
            answer = handler(request, exc)
            response = await answer if inspect.isawaitable(answer) else answer
        await response(scope, receive, send)


def _handler(handlers: Mapping[Any, Handler], exc: Exception) -> Handler | None:
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    return None
