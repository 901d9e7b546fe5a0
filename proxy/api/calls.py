"""What every LLM route does before and after its dialect: authenticate, read the body, check the
model, identify the session, open the call, and the headers every reply carries."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import Request

from talaria.core.calls import Call
from talaria.proxy.api.context import ProxyContext, context, parse_json, read_bytes
from talaria.proxy.cluster.forward import Forwarded
from talaria.proxy.cluster.owner import route_key
from talaria.proxy.errors import ApiError, unknown_model
from talaria.proxy.gateway import Api, CallHandle, CallOutcome, PreparedCall
from talaria.proxy.records import Record
from talaria.proxy.sessions.identity import Identity, IdentityError, identify


async def tenant_of(ctx: ProxyContext, request: Request) -> str:
    """The caller's tenant: the key comes as ``Authorization: Bearer`` or ``x-api-key``
    (Anthropic's clients send the latter)."""
    client = request.client.host if request.client else None
    authorization = request.headers.get("authorization")
    if not authorization and request.headers.get("x-api-key"):
        authorization = f"Bearer {request.headers['x-api-key']}"
    return await ctx.auth.tenant(authorization, client)


async def read_body(request: Request) -> tuple[ProxyContext, str, Any]:
    """(context, tenant, JSON body): authentication first, so a stranger's body is not read.
    With replicas, a call whose session a header names outright is forwarded to its owner
    here, before its body is parsed (``early_route_key``)."""
    ctx = context(request)
    tenant = await tenant_of(ctx, request)
    body = await read_bytes(request, ctx.settings.max_request_bytes)
    if ctx.cluster is not None:
        await forward_to_owner(request, ctx, early_route_key(request, tenant), None)
    return ctx, tenant, parse_json(body)


def early_route_key(request: Request, tenant: str) -> str | None:
    """The route key when a header that outranks every body field names the session
    (X-Talaria-Session-Id, X-Claude-Code-Session-Id: proxy/sessions/identity.py), so the
    body cannot change it; else None (the key needs the parsed call)."""
    try:
        identity = identify(request.headers, {})
    except IdentityError:
        return None  # refused with its 400 once the call is parsed
    if identity.source not in HEADER_FIRST_SOURCES:
        return None
    return route_key(tenant, identity.session_id, None)


HEADER_FIRST_SOURCES = ("talaria", "claude-code")


def identity_of(request: Request, body: Any) -> Identity:
    try:
        return identify(request.headers, body if isinstance(body, dict) else {})
    except IdentityError as exc:
        raise ApiError(400, str(exc), param=exc.field, code="invalid_session") from exc


def check_model(ctx: ProxyContext, model: str) -> None:
    if model not in ctx.gateway.models():
        raise unknown_model(model, ctx.gateway.models())


async def forward_to_owner(request: Request, ctx: ProxyContext, key: str | None, body: Any) -> None:
    """With replicas: raise ``Forwarded`` with the owner's answer when the session of ``key``
    belongs to another replica (proxy/cluster/); return when this one serves it."""
    if ctx.cluster is None:
        return
    response = await ctx.cluster.forward(request, body, key)
    if response is not None:
        raise Forwarded(response)


async def ask_peers(
    request: Request, ctx: ProxyContext, body: Any, answered: Callable[[int, Any], bool]
) -> None:
    """With replicas: for a session this replica does not hold, raise ``Forwarded`` with the
    first peer's answer that is ``answered``; return when none is."""
    if ctx.cluster is None:
        return
    response = await ctx.cluster.ask_peers(request, body, answered)
    if response is not None:
        raise Forwarded(response)


async def open_call(
    request: Request,
    ctx: ProxyContext,
    tenant: str,
    api: Api,
    call: Call,
    body: Any,
    extra_records: Callable[[CallOutcome], Sequence[Record]] | None = None,
) -> tuple[CallHandle, dict[str, str]]:
    """Start the call; returns its handle and the headers of the reply. ``extra_records``:
    what the API stores with the call's records when it succeeds."""
    identity = identity_of(request, body)
    key = route_key(tenant, identity.session_id, call.messages)
    await forward_to_owner(request, ctx, key, body)
    check_model(ctx, call.model)
    prepared = PreparedCall(
        request_id=request.state.request_id,
        tenant_id=tenant,
        identity=identity,
        api=api,
        call=call,
        max_tokens=call.max_output_tokens or ctx.settings.max_output_tokens,
        extra_records=extra_records,
        route_key=key if ctx.cluster is not None else None,
    )
    handle = await ctx.gateway.open_call(prepared)
    headers = {
        "x-talaria-session-id": handle.session_id,
        "x-talaria-session-key": handle.session_key,
        "x-talaria-instance": handle.instance,
    }
    return handle, headers


SSE_HEADERS = {"cache-control": "no-cache"}
