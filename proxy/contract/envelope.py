"""The envelope a refused call is answered in: what routes outside the dialects need of a
dialect (the relay of a forwarded stream, the app's error handlers), without depending on the
dialects themselves (proxy/dialects/base.py ``Dialect`` is one).

Which envelope answers a request is found from the route it matched (``envelope_of``), never
from a URL prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import APIRouter
from starlette.routing import Match

from talaria.proxy.contract.errors import ApiError


def openai_error(error: ApiError) -> tuple[int, dict[str, Any]]:
    """(status, body) of ``error`` in OpenAI's envelope."""
    return error.status, error.body()


def openai_stream_error(error: ApiError) -> bytes:
    """``error`` as OpenAI's last stream frame: ``data: {"error": {...}}``."""
    return error.sse()


class Envelope(Protocol):
    """An API's error envelope, and the routes it answers for."""

    @property
    def router(self) -> APIRouter:
        """Its routes."""

    @property
    def endpoints(self) -> frozenset[Callable[..., Any]]:
        """Its routes' endpoints."""

    def error(self, error: ApiError) -> tuple[int, dict[str, Any]]:
        """(status, body) of ``error`` as a JSON answer."""

    def stream_error(self, error: ApiError) -> bytes:
        """``error`` as the last event of a stream that has begun."""


@dataclass(frozen=True)
class OpenAIEnvelope:
    """OpenAI's envelope: the one of every route no dialect owns (admin, sessions, health)."""

    router: APIRouter
    endpoints: frozenset[Callable[..., Any]] = frozenset()

    def error(self, error: ApiError) -> tuple[int, dict[str, Any]]:
        """OpenAI's JSON error."""
        return openai_error(error)

    def stream_error(self, error: ApiError) -> bytes:
        """OpenAI's last stream frame."""
        return openai_stream_error(error)


OPENAI = OpenAIEnvelope(APIRouter())


def envelope_of(scope: MutableMapping[str, Any], envelopes: Iterable[Envelope]) -> Envelope:
    """The envelope whose route ``scope`` matched or, before routing ran (a request refused
    by a middleware), would match (a path whose method is wrong counts); ``OPENAI`` when none
    does."""
    route = scope.get("route")
    endpoint = scope.get("endpoint") or getattr(route, "endpoint", None)
    for envelope in envelopes:
        if endpoint is not None:
            if endpoint in envelope.endpoints:
                return envelope
        elif any(r.matches(scope)[0] is not Match.NONE for r in envelope.router.routes):
            return envelope
    return OPENAI
