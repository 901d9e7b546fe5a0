"""What a dialect is to the app: its routes, the pydantic models of its request bodies (which
are its validation and its OpenAPI schema), its error envelope, plain and in a stream, and, for
a stateful dialect, its service (state, background tasks, quotas: started before the app serves
and closed after it, proxy/edge/app.py) and its own store tables (records that are a
``TableRecord``: proxy/contract/records.py), all declared in its folder.

A route reads its body by hand (the session is identified and the call placed before the body
is parsed: proxy/callpath/door.py), so FastAPI cannot see the body's model; the route declares it
with ``openapi_extra=request_body(Model)`` and the app adds the nested models' schemas to the
document's components (``components``). Which dialect's envelope answers a request is found
from the route it matched (proxy/contract/envelope.py ``envelope_of``), never from a URL
prefix.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from fastapi import APIRouter, Request
from pydantic import BaseModel

from talaria.proxy.contract.envelope import openai_error, openai_stream_error
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.contract.settings import PluginSettings, ProxySettings
from talaria.proxy.store.repository import SqlStore
from talaria.proxy.store.writer import BatchWriter

REF_TEMPLATE = "#/components/schemas/{model}"
"""Where the nested models of a request body live in the OpenAPI document."""


@dataclass(frozen=True)
class DialectSite:
    """What a dialect's service is built from: the proxy's settings, the store (its
    ``sessionmaker`` serves the dialect's own tables) and the batched writer its records go
    through."""

    settings: ProxySettings
    store: SqlStore
    writer: BatchWriter


class DialectService(Protocol):
    """A stateful dialect's state and tasks: started before the app serves (in the app's
    lifecycle, after the store), closed after it stops serving."""

    async def start(self) -> None:
        """Load what it needs and start its tasks."""

    async def close(self) -> None:
        """Stop its tasks."""


@dataclass(frozen=True)
class Dialect:
    """One API dialect. ``error`` and ``stream_error`` render an ``ApiError`` in its envelope
    (a JSON body, and the last event of a stream that has begun); ``models`` are its request
    bodies, whose nested models go to the OpenAPI components; ``service`` builds a stateful
    dialect's service (:func:`service_of` reaches it from a route), from its ``settings``
    (declared beside it: proxy/contract/settings.py ``PluginSettings``; the app checks them
    when it is made)."""

    name: str
    router: APIRouter
    models: tuple[type[BaseModel], ...]
    error: Callable[[ApiError], tuple[int, dict[str, Any]]] = openai_error
    stream_error: Callable[[ApiError], bytes] = openai_stream_error
    service: Callable[[DialectSite], DialectService] | None = None
    settings: type[PluginSettings] | None = None
    endpoints: frozenset[Callable[..., Any]] = field(init=False)

    def __post_init__(self) -> None:
        owned = frozenset(getattr(r, "endpoint", None) for r in self.router.routes)
        object.__setattr__(self, "endpoints", owned - {None})


Service = TypeVar("Service", bound=DialectService)


def service_of(request: Request, dialect: str, kind: type[Service]) -> Service:
    """The service of ``dialect`` that the app started (``app.state.dialect_services``)."""
    service = request.app.state.dialect_services[dialect]
    if not isinstance(service, kind):
        raise TypeError(f"dialect {dialect!r}'s service is a {type(service).__name__}")
    return service


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route whose JSON body is ``model``: its schema, with nested
    models referenced in the components (``components`` adds them)."""
    schema = model.model_json_schema(ref_template=REF_TEMPLATE)
    schema.pop("$defs", None)
    content = {"application/json": {"schema": schema}}
    return {"requestBody": {"required": True, "content": content}}


def components(models: Iterable[type[BaseModel]]) -> dict[str, Any]:
    """The schemas of every model nested in ``models``' bodies, by name. Two different
    schemas under one name are a programming error (rename a model): ``ValueError``."""
    found: dict[str, Any] = {}
    for model in models:
        nested = model.model_json_schema(ref_template=REF_TEMPLATE).get("$defs", {})
        for name, schema in nested.items():
            if name in found and found[name] != schema:
                raise ValueError(f"two request models share the schema name {name!r}")
            found[name] = copy.deepcopy(schema)
    return found
