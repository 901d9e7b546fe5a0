"""A dialect is one folder plus one registry line: a toy dialect, built here the way
proxy/dialects/chat/ is (a pydantic request model, a parse into a ``Call``, a render, routes,
and a ``Dialect`` with its own error envelope), is served end to end over HTTP by a proxy
given ``DIALECTS + (TOY,)``: its calls run on the runtime and are recorded, its body model is
the OpenAPI schema of its route (nested models in the components), and every error on its
route (a refused body, a bad internal header, a wrong method) comes in its envelope."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from talaria.core.calls import Call
from talaria.proxy.callpath.context import json_response
from talaria.proxy.callpath.door import open_call, read_body
from talaria.proxy.contract.calls import ApiCall
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.dialects.base import Dialect, request_body
from talaria.proxy.dialects.common import parse
from talaria.proxy.dialects.registry import DIALECTS
from talaria.runtime.instant import InstantRuntime
from tests.integration.server import RunningProxy, running_proxy

MODEL = "bench-model"


class ToyLine(BaseModel):
    """One line of the toy conversation."""

    speaker: str = Field(pattern="^(me|you)$")
    said: str


class ToyRequest(BaseModel):
    """The toy dialect's body: a model and the lines so far."""

    model: str
    lines: list[ToyLine] = Field(min_length=1)


def toy_call(body: ToyRequest) -> Call:
    roles = {"me": "user", "you": "assistant"}
    messages = tuple({"role": roles[line.speaker], "content": line.said} for line in body.lines)
    return Call(model=body.model, messages=messages, max_output_tokens=8)


toy_router = APIRouter()


@toy_router.post("/v1/toy/say", openapi_extra=request_body(ToyRequest))
async def say(request: Request) -> Response:
    ctx, raw = await read_body(request)
    call = toy_call(parse(ToyRequest, raw, status=400))
    handle = await open_call(ctx, ApiCall("toy", call, raw))
    outcome = await handle.outcome()
    return json_response({"reply": outcome.output.text, "ok": True}, headers=handle.headers())


def toy_error(error: ApiError) -> tuple[int, dict[str, Any]]:
    return error.status, {"toy_error": error.message}


TOY = Dialect("toy", toy_router, (ToyRequest,), error=toy_error)


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("toy")
    cfg = ProxySettings(database_url=f"sqlite+aiosqlite:///{tmp}/t.db", admin_token="a" * 20)
    runtime = InstantRuntime((MODEL,), output_tokens=4)
    with running_proxy(cfg, runtimes=[runtime], dialects=(*DIALECTS, TOY)) as running:
        yield running


def test_a_toy_dialect_serves_calls_in_sessions(proxy: RunningProxy) -> None:
    body = {"model": MODEL, "lines": [{"speaker": "me", "said": "hello"}]}
    reply = httpx.post(
        proxy.base_url + "/v1/toy/say", json=body, headers={"x-talaria-session-id": "toy-1"}
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["ok"] is True
    assert reply.headers["x-talaria-session-id"] == "toy-1"
    admin = httpx.get(
        proxy.base_url + "/admin/sessions/toy-1", headers={"authorization": "Bearer " + "a" * 20}
    )
    assert admin.status_code == 200, admin.text
    assert [c["api"] for c in admin.json()["calls"]] == ["toy"]


def test_its_model_is_the_openapi_schema(proxy: RunningProxy) -> None:
    document = httpx.get(proxy.base_url + "/openapi.json").json()
    body = document["paths"]["/v1/toy/say"]["post"]["requestBody"]["content"]["application/json"]
    schema = body["schema"]
    assert schema["required"] == ["model", "lines"]
    assert schema["properties"]["lines"]["items"] == {"$ref": "#/components/schemas/ToyLine"}
    line = document["components"]["schemas"]["ToyLine"]
    assert line["properties"]["speaker"]["pattern"] == "^(me|you)$"


@pytest.mark.parametrize(
    ("method", "body", "headers", "status"),
    [
        ("POST", {"model": MODEL, "lines": []}, {}, 400),  # refused by its model
        ("POST", {"model": MODEL, "lines": [{"speaker": "them", "said": "x"}]}, {}, 400),
        ("POST", {"model": "nope", "lines": [{"speaker": "me", "said": "x"}]}, {}, 404),
        ("POST", {"model": MODEL}, {"x-talaria-forwarded-by": "r1"}, 400),  # before routing
        ("GET", None, {}, 405),  # the route's path, the wrong method
    ],
)
def test_its_errors_come_in_its_envelope(
    proxy: RunningProxy, method: str, body: Any, headers: dict[str, str], status: int
) -> None:
    reply = httpx.request(method, proxy.base_url + "/v1/toy/say", json=body, headers=headers)
    assert reply.status_code == status, reply.text
    assert set(reply.json()) == {"toy_error"}, reply.text
    # the other routes keep theirs
    chat = httpx.request(
        method, proxy.base_url + "/v1/chat/completions", json=body, headers=headers
    )
    assert "error" in chat.json(), chat.text
