"""What every LLM route does before and after its dialect: authenticate, read the body, check the
model, identify the session, open the call, and the headers every reply carries. The call's
context (proxy/callpath/call.py ``CallContext``) goes from stage to stage: ``read_body`` builds
it, the route hands it to ``open_call`` with what its dialect parsed."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from fastapi import Request

from talaria.core.calls import Call
from talaria.proxy.callpath.call import CallContext, Identified, KeptBody
from talaria.proxy.callpath.context import ProxyContext, context, parse_json, read_bytes
from talaria.proxy.cluster.forward import Forwarded
from talaria.proxy.cluster.owner import placement_key
from talaria.proxy.contract.arrival import arrival_of
from talaria.proxy.contract.calls import ApiCall, Caller, CallHandle, NormalisedPrompt, PreparedCall
from talaria.proxy.contract.errors import ApiError, unavailable, unknown_model
from talaria.proxy.contract.identity import Identity
from talaria.proxy.placement.loop import ColdStartFailed
from talaria.proxy.sessions.identity import (
    IdentityError,
    Source,
    headers_of,
    identify,
    named_by_header,
    session_sources,
)
from talaria.proxy.sessions.normalise import normalise, prompt_parts

COLD_RETRY_S = 30.0
"""Retry-After of a call whose model's cold start failed (seconds)."""


async def tenant_of(proxy: ProxyContext, request: Request) -> str:
    """The caller's tenant (:func:`caller_of`'s)."""
    return (await caller_of(proxy, request)).tenant_id


async def caller_of(proxy: ProxyContext, request: Request) -> Caller:
    """The caller (its tenant, its key's priority and weight): the key comes as
    ``Authorization: Bearer`` or ``x-api-key`` (Anthropic's clients send the latter). A
    request an untrusted peer relayed has no known client (proxy/contract/peer.py): open mode
    does not take its loopback peer for a local caller."""
    relayed = arrival_of(request).relayed
    client = request.client.host if request.client and not relayed else None
    authorization = request.headers.get("authorization")
    if not authorization and request.headers.get("x-api-key"):
        authorization = f"Bearer {request.headers['x-api-key']}"
    return await proxy.auth.caller(authorization, client)


async def read_body(request: Request) -> tuple[CallContext, Any]:
    """(the call's context, the JSON body): authentication first, so a stranger's body is not
    read. The caller (its key's defaults) and the session's identity are found here, once per
    request, and kept in the context for ``open_call``. A call whose session a header names
    outright is placed here, before its body is parsed: with replicas, forwarded to its
    owner."""
    proxy = context(request)
    caller = await caller_of(proxy, request)
    raw = await read_bytes(request, proxy.settings.max_request_bytes)
    kept = KeptBody(raw if proxy.cluster is not None else None)  # a replica may forward them
    arrival = arrival_of(request)
    if named_by_header(request.headers, _sources(proxy)):  # the body cannot change the identity
        ctx = CallContext(request, proxy, arrival, caller, _identify(request, proxy, {}), kept)
        identity = ctx.identified.identity
        if identity is not None:
            await forward_to_owner(ctx, _placement_key(ctx, identity, None), None)
            ctx = replace(ctx, placed=True)
        body = parse_json(raw)
    else:
        body = parse_json(raw)
        ctx = CallContext(request, proxy, arrival, caller, _identify(request, proxy, body), kept)
    return ctx, body


def _sources(proxy: ProxyContext) -> tuple[Source, ...]:
    """The identity table: the built-in rows and ``TALARIA_SESSION_HEADERS``'s."""
    return session_sources(proxy.settings.session_headers)


def _identify(request: Request, proxy: ProxyContext, body: Any) -> Identified:
    """The request's identity; its tool-gap hint counted as at most ``max_hint_gap_s``
    (``TALARIA_MAX_HINT_GAP_S``: a longer claim holds no longer, here or on the node)."""
    try:
        found = identify(request.headers, body if isinstance(body, dict) else {}, _sources(proxy))
    except IdentityError as exc:
        return Identified(None, ApiError(400, str(exc), param=exc.field, code=exc.code))
    cap_s = proxy.settings.max_hint_gap_s
    if found.tool_gap_hint_s is not None and found.tool_gap_hint_s > cap_s:
        found = replace(found, tool_gap_hint_s=cap_s)
    return Identified(found)


def _normalised(ctx: CallContext, call: Call) -> tuple[Call, NormalisedPrompt | None]:
    """The call as the engine gets it, and what prompt normalisation took out of its system
    text (proxy/sessions/normalise.py; None: nothing). The engine gets the normalised
    messages unless the switch is off for the call (``CallContext.normalises_prompts``)."""
    if call.messages is None:
        return call, None
    found = normalise(call.messages, prompt_parts(ctx.proxy.settings.prompt_patterns))
    if found is None:
        return call, None
    if not ctx.normalises_prompts:
        return call, replace(found, engine=False)
    return replace(call, messages=found.messages), found


def _placement_key(
    ctx: CallContext, identity: Identity, messages: Sequence[Mapping[str, Any]] | None
) -> str | None:
    """The key the call is placed by among replicas (proxy/cluster/owner.py)."""
    settings = ctx.proxy.settings
    ingress = settings.replica_affinity == "ingress"
    names = headers_of(_sources(ctx.proxy))
    return placement_key(
        ctx.tenant, identity.placed_by, messages, ctx.request.headers, ingress=ingress, names=names
    )


def reservation_tokens(call: Call, max_tokens: int) -> int:
    """The tokens a rate-limited call reserves against its key's minute as it is admitted:
    its prompt as the proxy counts it (``Call.prompt_tokens``, the estimate the gateway routes
    and fits the context window by) plus its output limit, the most it may produce: the
    client's own, or for a call that sets none the server's cap (``TALARIA_MAX_OUTPUT_TOKENS``,
    4,096 by default) that the engine holds it to. Not a typical reply's length (agents'
    replies are ~110–230 tokens, docs/sources.md): a guess below the limit would let a burst
    of calls pass ``tpm`` by their difference; what a call did not use is given back when it
    ends (proxy/callpath/limits.py, "Reservations")."""
    return call.prompt_tokens() + max_tokens


async def check_model(proxy: ProxyContext, model: str) -> bool:
    """Whether some instance hosts ``model`` now (True), or the placement library has it
    (False: it can be started); else 404 (``unknown_model``). A model no instance listed may
    have been placed since (runtime/placement_routes.py): the instances' models are read again
    (their statuses, cached for ``status_ttl_s``) before the answer. Starts nothing."""
    pool = proxy.pool
    if model in pool.models():
        return True
    await pool.statuses(None)
    if model in pool.models():
        return True
    if proxy.placement is not None and model in proxy.placement.library:
        return False
    raise unknown_model(model, pool.models())


async def ensure_model(proxy: ProxyContext, model: str) -> None:
    """:func:`check_model`, and a library model no instance hosts started for the call (its
    cold start: proxy/placement/loop.py ``ensure``; 503 with Retry-After if it cannot be)."""
    if await check_model(proxy, model):
        return
    assert proxy.placement is not None  # check_model: a library model
    try:
        if await proxy.placement.ensure(model):
            return
    except ColdStartFailed as exc:
        raise unavailable(
            f"The model {model} could not be started: {exc}", retry_after_s=COLD_RETRY_S
        ) from exc
    raise unknown_model(model, proxy.pool.models())


async def forward_to_owner(ctx: CallContext, key: str | None, body: Any) -> None:
    """With replicas: raise ``Forwarded`` with the owner's answer when the session of ``key``
    belongs to another replica (proxy/cluster/); return when this one serves it. The owner
    gets the body's bytes as they came (``body`` as JSON when they were not kept)."""
    cluster = ctx.proxy.cluster
    if cluster is None:
        return
    raw = ctx.kept.raw
    content = raw if raw is not None else json.dumps(body).encode()
    response = await cluster.forward(ctx.request, content, key)
    if response is not None:
        raise Forwarded(response)


async def ask_peers(
    request: Request, proxy: ProxyContext, body: Any, answered: Callable[[int, Any], bool]
) -> None:
    """With replicas: for a session this replica does not hold, raise ``Forwarded`` with the
    first peer's answer that is ``answered``; return when none is."""
    if proxy.cluster is None:
        return
    response = await proxy.cluster.ask_peers(request, body, answered)
    if response is not None:
        raise Forwarded(response)


async def open_call(ctx: CallContext, parsed: ApiCall) -> CallHandle:
    """Start the call its dialect parsed (after ``read_body``, whose context ``ctx`` is): its
    session's identity (400 if malformed), its system text normalised (``_normalised``), its
    place (with replicas, forwarded to the owner of a session its body identifies), its key's
    rate limits (429; the call and its tokens reserved here, given back if it is refused
    before it runs, settled when it ends: proxy/callpath/limiter.py), its model, then the
    gateway. Returns its handle (its ``headers()`` are the reply's)."""
    identity = ctx.identified.get()
    proxy = ctx.proxy
    call, normalised = _normalised(ctx, parsed.content)
    found_by = normalised.messages if normalised is not None else call.messages
    key = _placement_key(ctx, identity, found_by)
    if not ctx.placed:
        await forward_to_owner(ctx, key, parsed.body)
    ctx.kept.drop()  # served here: its bytes were kept only to forward them
    max_tokens = call.max_output_tokens or proxy.settings.max_output_tokens
    limiter, limits = proxy.limits, ctx.caller.limits
    ticket = None
    if limiter is not None and limits is not None:  # or 429
        ticket = limiter.admit(limits, reservation_tokens(call, max_tokens))
    try:
        await ensure_model(proxy, call.model)
        prepared = PreparedCall(
            request_id=ctx.request_id,
            tenant_id=ctx.tenant,
            identity=identity,
            api=parsed.api,
            content=call,
            max_tokens=max_tokens,
            extra_records=parsed.extra_records,
            route_key=key if proxy.cluster is not None else None,
            format_param=parsed.format_param,
            share=ctx.share(identity),
            on_settled=limiter.settlement(ticket) if limiter is not None else None,
            normalised=normalised,
        )
        handle = await proxy.gateway.open_call(prepared)
    except BaseException:
        if limiter is not None:
            limiter.release(ticket)  # refused before it ran: not counted
        raise
    ctx.arrival.runtime_clock = handle.clock  # the overhead header's (proxy/edge/http.py)
    return handle


SSE_HEADERS = {"cache-control": "no-cache"}
"""What every streamed reply carries besides the call's own headers."""
