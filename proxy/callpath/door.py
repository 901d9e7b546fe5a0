"""What every LLM route does before and after its dialect: authenticate, read the body, check the
model, identify the session, open the call, and the headers every reply carries."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fastapi import Request

from talaria.core.calls import Call
from talaria.proxy.callpath.context import ProxyContext, context, parse_json, read_bytes
from talaria.proxy.cluster.forward import Forwarded
from talaria.proxy.cluster.owner import placement_key
from talaria.proxy.contract.calls import (
    ApiCall,
    Caller,
    CallHandle,
    NormalisedPrompt,
    PreparedCall,
    RateLimits,
    Share,
)
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


async def tenant_of(ctx: ProxyContext, request: Request) -> str:
    """The caller's tenant (:func:`caller_of`'s)."""
    return (await caller_of(ctx, request)).tenant_id


async def caller_of(ctx: ProxyContext, request: Request) -> Caller:
    """The caller (its tenant, its key's priority and weight): the key comes as
    ``Authorization: Bearer`` or ``x-api-key`` (Anthropic's clients send the latter). A
    request an untrusted peer relayed has no known client (proxy/contract/peer.py): open mode
    does not take its loopback peer for a local caller."""
    relayed = getattr(request.state, "relayed", False)
    client = request.client.host if request.client and not relayed else None
    authorization = request.headers.get("authorization")
    if not authorization and request.headers.get("x-api-key"):
        authorization = f"Bearer {request.headers['x-api-key']}"
    return await ctx.auth.caller(authorization, client)


async def read_body(request: Request) -> tuple[ProxyContext, str, Any]:
    """(context, tenant, JSON body): authentication first, so a stranger's body is not read.
    The caller (``request.state.caller``: its key's defaults) and the session's identity are
    found here, once per request, and kept for ``open_call`` (``request.state.identified``).
    A call whose session a header names outright is placed here, before its body is parsed:
    with replicas, forwarded to its owner."""
    ctx = context(request)
    caller = request.state.caller = await caller_of(ctx, request)
    tenant = caller.tenant_id
    raw = await read_bytes(request, ctx.settings.max_request_bytes, ctx.cluster is not None)
    if named_by_header(request.headers, _sources(ctx)):  # the body cannot change the identity
        known = _identify(request, ctx, {})
        if known.identity is not None:
            key = _placement_key(request, ctx, tenant, known.identity, None)
            await forward_to_owner(request, ctx, key, None)
            known = replace(known, placed=True)
        body = parse_json(raw)
    else:
        body = parse_json(raw)
        known = _identify(request, ctx, body)
    request.state.identified = known
    return ctx, tenant, body


@dataclass(frozen=True)
class Identified:
    """A request's session identity as ``read_body`` found it: the identity, or the 400 of
    a malformed id or hint (raised by ``open_call``, once the call is parsed)."""

    identity: Identity | None
    error: ApiError | None = None
    placed: bool = False
    """Whether the call was already placed (a header named its session: its owner was
    looked up before the body was parsed)."""

    def get(self) -> Identity:
        """The identity, or its error raised."""
        if self.identity is None:
            assert self.error is not None
            raise self.error
        return self.identity


def _sources(ctx: ProxyContext) -> tuple[Source, ...]:
    """The identity table: the built-in rows and ``TALARIA_SESSION_HEADERS``'s."""
    return session_sources(ctx.settings.session_headers)


def _identify(request: Request, ctx: ProxyContext, body: Any) -> Identified:
    """The request's identity; its tool-gap hint counted as at most ``max_hint_gap_s``
    (``TALARIA_MAX_HINT_GAP_S``: a longer claim holds no longer, here or on the node)."""
    try:
        found = identify(request.headers, body if isinstance(body, dict) else {}, _sources(ctx))
    except IdentityError as exc:
        return Identified(None, ApiError(400, str(exc), param=exc.field, code=exc.code))
    cap_s = ctx.settings.max_hint_gap_s
    if found.tool_gap_hint_s is not None and found.tool_gap_hint_s > cap_s:
        found = replace(found, tool_gap_hint_s=cap_s)
    return Identified(found)


def _share(request: Request, tenant: str, identity: Identity) -> Share:
    """The call's terms in the node's fair queue: its key's weight (``read_body``'s caller),
    the class its headers ask within the key's ceiling (``Caller.served``: lower than the
    key's, never higher than ``--max-priority``), its headers' deadline."""
    caller: Caller | None = getattr(request.state, "caller", None)
    key = caller if caller is not None and caller.tenant_id == tenant else Caller(tenant)
    return Share(key.served(identity.priority), key.share.weight, identity.deadline_s)


def _limits(request: Request, tenant: str) -> RateLimits | None:
    """The rate limits of the call's key (``read_body``'s caller); None: not limited."""
    caller: Caller | None = getattr(request.state, "caller", None)
    return caller.limits if caller is not None and caller.tenant_id == tenant else None


def _normalised(
    request: Request, ctx: ProxyContext, tenant: str, call: Call
) -> tuple[Call, NormalisedPrompt | None]:
    """The call as the engine gets it, and what prompt normalisation took out of its system
    text (proxy/sessions/normalise.py; None: nothing). The engine gets the normalised
    messages unless the switch is off for the call: its key's ``normalise_prompts``
    (``read_body``'s caller), else ``TALARIA_NORMALISE_PROMPTS``."""
    if call.messages is None:
        return call, None
    found = normalise(call.messages, prompt_parts(ctx.settings.prompt_patterns))
    if found is None:
        return call, None
    caller: Caller | None = getattr(request.state, "caller", None)
    keyed = caller.normalise_prompts if caller is not None and caller.tenant_id == tenant else None
    if not (ctx.settings.normalise_prompts if keyed is None else keyed):
        return call, replace(found, engine=False)
    return replace(call, messages=found.messages), found


def _placement_key(
    request: Request,
    ctx: ProxyContext,
    tenant: str,
    identity: Identity,
    messages: Sequence[Mapping[str, Any]] | None,
) -> str | None:
    """The key the call is placed by among replicas (proxy/cluster/owner.py)."""
    ingress = ctx.settings.replica_affinity == "ingress"
    names = headers_of(_sources(ctx))
    return placement_key(
        tenant, identity.placed_by, messages, request.headers, ingress=ingress, names=names
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


async def check_model(ctx: ProxyContext, model: str) -> bool:
    """Whether some instance hosts ``model`` now (True), or the placement library has it
    (False: it can be started); else 404 (``unknown_model``). A model no instance listed may
    have been placed since (runtime/placement_routes.py): the instances' models are read again
    (their statuses, cached for ``status_ttl_s``) before the answer. Starts nothing."""
    pool = ctx.gateway.pool
    if model in pool.models():
        return True
    await pool.statuses(None)
    if model in pool.models():
        return True
    if ctx.placement is not None and model in ctx.placement.library:
        return False
    raise unknown_model(model, pool.models())


async def ensure_model(ctx: ProxyContext, model: str) -> None:
    """:func:`check_model`, and a library model no instance hosts started for the call (its
    cold start: proxy/placement/loop.py ``ensure``; 503 with Retry-After if it cannot be)."""
    if await check_model(ctx, model):
        return
    assert ctx.placement is not None  # check_model: a library model
    try:
        if await ctx.placement.ensure(model):
            return
    except ColdStartFailed as exc:
        raise unavailable(
            f"The model {model} could not be started: {exc}", retry_after_s=COLD_RETRY_S
        ) from exc
    raise unknown_model(model, ctx.gateway.pool.models())


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
    request: Request, ctx: ProxyContext, tenant: str, parsed: ApiCall
) -> CallHandle:
    """Start the call its dialect parsed (after ``read_body``): its session's identity (400 if
    malformed), its system text normalised (``_normalised``), its place (with replicas,
    forwarded to the owner of a session its body identifies), its key's rate limits (429; the
    call and its tokens reserved here, given back if it is refused before it runs, settled when
    it ends: proxy/callpath/limiter.py), its model, then the gateway. Returns its handle (its
    ``headers()`` are the reply's)."""
    known: Identified = request.state.identified  # read_body's
    identity = known.get()
    call, normalised = _normalised(request, ctx, tenant, parsed.content)
    found_by = normalised.messages if normalised is not None else call.messages
    key = _placement_key(request, ctx, tenant, identity, found_by)
    if not known.placed:
        await forward_to_owner(request, ctx, key, parsed.body)
    request.state.body = None  # served here: its bytes were kept only to forward them
    max_tokens = call.max_output_tokens or ctx.settings.max_output_tokens
    limiter, limits = ctx.limits, _limits(request, tenant)
    ticket = None
    if limiter is not None and limits is not None:  # or 429
        ticket = limiter.admit(limits, reservation_tokens(call, max_tokens))
    try:
        await ensure_model(ctx, call.model)
        prepared = PreparedCall(
            request_id=request.state.request_id,
            tenant_id=tenant,
            identity=identity,
            api=parsed.api,
            content=call,
            max_tokens=max_tokens,
            extra_records=parsed.extra_records,
            route_key=key if ctx.cluster is not None else None,
            format_param=parsed.format_param,
            share=_share(request, tenant, identity),
            on_settled=limiter.settlement(ticket) if limiter is not None else None,
            normalised=normalised,
        )
        handle = await ctx.gateway.open_call(prepared)
    except BaseException:
        if limiter is not None:
            limiter.release(ticket)  # refused before it ran: not counted
        raise
    request.state.runtime_clock = handle.clock  # the overhead header's (proxy/edge/http.py)
    return handle


SSE_HEADERS = {"cache-control": "no-cache"}
"""What every streamed reply carries besides the call's own headers."""
