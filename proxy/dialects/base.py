"""What a dialect is to the app: its routes, the pydantic models of its request bodies (which
are its validation and its OpenAPI schema), and its error envelope, plain and in a stream.

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
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel

from talaria.proxy.contract.envelope import openai_error, openai_stream_error
from talaria.proxy.contract.errors import ApiError

REF_TEMPLATE = "#/components/schemas/{model}"
"""Where the nested models of a request body live in the OpenAPI document."""


@dataclass(frozen=True)
class Dialect:
    """One API dialect. ``error`` and ``stream_error`` render an ``ApiError`` in its envelope
    (a JSON body, and the last event of a stream that has begun); ``models`` are its request
    bodies, whose nested models go to the OpenAPI components."""

    name: str
    router: APIRouter
    models: tuple[type[BaseModel], ...]
    error: Callable[[ApiError], tuple[int, dict[str, Any]]] = openai_error
    stream_error: Callable[[ApiError], bytes] = openai_stream_error
    endpoints: frozenset[Callable[..., Any]] = field(init=False)

    def __post_init__(self) -> None:
        owned = frozenset(getattr(r, "endpoint", None) for r in self.router.routes)
        object.__setattr__(self, "endpoints", owned - {None})


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
