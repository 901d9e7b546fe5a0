"""Admin API under /admin: bearer ``TALARIA_ADMIN_TOKEN``; without a token it is off (404).

A session is named in its routes by its key (``session_key``, ``ses_<hex>``) or by a client's
id (``session_id``), which may hold ``/``: the session routes take it as a path
(``{session_id:path}``). Session views carry both, and ``parent_session_key``.

Reads flush the batched writer first, so what a caller just did is visible. A read (flush
included) that takes longer than ``admin_read_timeout_s``, or that the store fails, is a 503
with ``Retry-After``: the admin API never hangs on a store that is down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response

from talaria.core.status import InstanceStatus
from talaria.proxy.api.tenants import tenant_shares
from talaria.proxy.callpath.context import ProxyContext, context, json_response
from talaria.proxy.console.routes import client_address, console_auth, signed_in
from talaria.proxy.contract.errors import ApiError, unavailable
from talaria.proxy.store.sessions import SESSION_STATES, AmbiguousSession
from talaria.proxy.store.views import SessionDetail

router = APIRouter(prefix="/admin")
log = logging.getLogger("talaria.proxy.admin")
T = TypeVar("T")


async def _read(ctx: ProxyContext, read: Callable[[], Awaitable[T]]) -> T:
    """Flush the writer, then ``read()``, within the admin read timeout; 503 otherwise."""

    async def flushed_read() -> T:
        await ctx.writer.flush()
        return await read()

    timeout_s = ctx.settings.admin_read_timeout_s
    try:
        return await asyncio.wait_for(flushed_read(), timeout_s)
    except TimeoutError:
        raise unavailable(
            f"The session store did not answer within {timeout_s:g} s; retry later.",
            retry_after_s=timeout_s,
        ) from None
    except (ApiError, ValueError):
        raise
    except Exception as exc:
        log.warning("admin read failed: %r", exc)
        raise unavailable(f"The session store failed: {exc.__class__.__name__}.") from exc


def _admin(request: Request) -> ProxyContext:
    """The context, once the caller proves to be the operator: the admin token as a bearer
    token (a wrong one counts as a failed sign-in of its address; proxy/console/throttle.py
    says when even the right one waits),
    or the console's signed-in cookie (proxy/console/auth.py) — then, for a request that
    changes something, with the console's CSRF token in ``x-csrf-token``."""
    ctx = context(request)
    token = ctx.settings.admin_token
    if not token:
        raise ApiError(404, "The admin API is off (set TALARIA_ADMIN_TOKEN).", code="not_found")
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() == "bearer":
        verdict = console_auth(request).sign_in(client_address(request), value.strip())
        if verdict.retry_after_s is not None:
            raise ApiError(
                429,
                f"Too many failed sign-ins from this address; retry in {verdict.retry_after_s} s.",
                type="rate_limit_error",
                code="too_many_sign_ins",
                retry_after_s=verdict.retry_after_s,
            )
        if verdict.ok:
            return ctx
    login = signed_in(request)
    if login is None:
        raise ApiError(401, "Admin token required.", type="authentication_error")
    if request.method not in ("GET", "HEAD"):
        auth = console_auth(request)
        if not auth.csrf_ok(login, request.headers.get("x-csrf-token")):
            raise ApiError(403, "Missing or wrong CSRF token.", code="csrf_failed")
    return ctx


def _time(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError as exc:
        raise ApiError(400, f"{name} must be an ISO 8601 time", param=name) from exc


@router.get("/sessions")
async def list_sessions(
    request: Request,
    state: str | None = None,
    model: str | None = None,
    tenant: str | None = None,
    started_after: str | None = None,
    started_before: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
    roots: bool = True,
) -> Response:
    """Sessions newest first, a page at a time. With ``roots`` (the default) one row per root
    session, with ``children`` (how many sessions are under it) and ``family`` (calls, tokens
    and completion time summed over it and them); ``roots=false`` lists every session."""
    ctx = _admin(request)
    after, before = _time(started_after, "started_after"), _time(started_before, "started_before")
    if state is not None and state not in SESSION_STATES:
        raise ApiError(
            400, f"state must be one of {', '.join(SESSION_STATES)}, got {state!r}", param="state"
        )
    try:
        page = await _read(
            ctx,
            lambda: ctx.store.sessions.list_sessions(
                state=state,
                model=model,
                tenant_id=tenant,
                started_after=after,
                started_before=before,
                cursor=cursor,
                limit=limit,
                roots=roots,
            ),
        )
    except ValueError as exc:
        raise ApiError(400, str(exc), param="cursor" if cursor else "limit") from exc
    keys = [s.session_key for s in page.items]
    instances = await _read(ctx, lambda: ctx.store.sessions.last_instances(keys))
    families = await _read(ctx, lambda: ctx.store.sessions.families(keys)) if roots else {}
    data = []
    for s in page.items:
        row = {**asdict(s), "instance": instances.get(s.session_key)}
        family = families.get(s.session_key)
        if family is not None:
            row["children"] = family.sessions - 1
            row["family"] = asdict(family)
        data.append(row)
    return json_response({"data": data, "next_cursor": page.next_cursor})


@router.get("/sessions/{session_id:path}")
async def get_session(session_id: str, request: Request, tenant: str | None = None) -> Response:
    """A session by its key, or by a client's id (its newest session; ``tenant``, a name or
    an id, picks whose when several tenants use that id: without it, 409 listing them)."""
    ctx = _admin(request)
    try:
        detail = await _read(ctx, lambda: ctx.store.sessions.get_session(session_id, tenant))
    except AmbiguousSession as exc:
        raise ApiError(
            409,
            f"{exc}; pick one with ?tenant= (its name or id), or use the session's key.",
            code="ambiguous_session",
            param="tenant",
        ) from exc
    if detail is None:
        raise ApiError(404, f"No session {session_id!r}.", code="session_not_found")
    return json_response(timeline(detail))


def timeline(detail: SessionDetail) -> dict[str, Any]:
    """The session, its calls in order (each with its routing decision), the tool gaps
    between them (with the hint that announced each, if any) and its child sessions."""
    reasons = {d.request_id: d for d in detail.decisions}
    calls = []
    for call in detail.calls:
        decision = reasons.get(call.request_id)
        calls.append(
            {
                **asdict(call),
                "routing_reason": decision.reason if decision else None,
                "router": decision.router if decision else None,
                "routing_scores": decision.scores if decision else None,
            }
        )
    gaps = []
    for prev, nxt in zip(detail.calls, detail.calls[1:], strict=False):
        if prev.finished_at is None:
            continue
        hints = [
            asdict(h)
            for h in detail.hints
            if h.kind == "tool_gap" and prev.finished_at <= h.at <= nxt.arrived_at
        ]
        gaps.append(
            {
                "after_call": prev.call_index,
                "gap_s": (nxt.arrived_at - prev.finished_at).total_seconds(),
                "hinted_s": prev.tool_gap_hint_s,
                "hints": hints,
            }
        )
    return {
        "session": asdict(detail.session),
        "calls": calls,
        "tool_gaps": gaps,
        "reservations": [asdict(r) for r in detail.reservations],
        "hints": [asdict(h) for h in detail.hints],
        "children": [asdict(c) for c in detail.children],
    }


@router.post("/sessions/{session_id:path}/end")
async def end_session(session_id: str, request: Request) -> Response:
    """End a session, named by its key or a client's id: a live one (its reservation and KV
    released on its instance), else a stored one that is still open (one a stopped proxy
    left). The reply names the session ended: ``session_key`` (ours), ``session_id`` (the
    client's)."""
    ctx = _admin(request)
    live = await ctx.keeper.end_session(session_id, "admin", None)
    if live is not None:
        return json_response(_ended(live.key, live.session_id, live=True))
    if ctx.cluster is not None:  # live on another replica?
        held = await ctx.cluster.ask_peers(
            request,
            None,
            lambda status, doc: status == 200 and isinstance(doc, dict) and doc.get("live") is True,
        )
        if held is not None:
            return held
    try:
        ended = await _read(
            ctx, lambda: ctx.store.sessions.end_session(session_id, "admin", datetime.now(UTC))
        )
    except ValueError as exc:
        raise ApiError(409, f"{exc}; end one by its key.", code="ambiguous_session") from exc
    if ended is None:
        raise ApiError(404, f"No open session {session_id!r}.", code="session_not_found")
    return json_response(_ended(ended.session_key, ended.session_id, live=False))


def _ended(session_key: str, session_id: str, *, live: bool) -> dict[str, Any]:
    """The reply to an admin end: the session ended, and whether a proxy held it live."""
    return {"session_key": session_key, "session_id": session_id, "ended": True, "live": live}


@router.get("/dead-letters")
async def dead_letters(request: Request, limit: int = 100) -> Response:
    """Records the database refused for their content, newest first (and where the file of
    those that could not even be kept in the database is)."""
    ctx = _admin(request)
    if not 1 <= limit <= 1000:
        raise ApiError(400, "limit must be between 1 and 1000", param="limit")
    letters = await _read(ctx, lambda: ctx.store.dead_letters.list_dead_letters(limit))
    return json_response(
        {
            "data": [asdict(d) for d in letters],
            "file": str(ctx.stored.dead_letters.path),
            "quarantined_since_start": ctx.writer.quarantined,
        }
    )


@router.get("/instances")
async def instances(request: Request) -> Response:
    ctx = _admin(request)
    data: list[dict[str, Any]] = []
    for runtime in ctx.pool.runtimes:
        try:
            status = await runtime.status()
        except Exception as exc:  # an unreachable instance is reported, not fatal
            data.append({"name": runtime.name, "kind": runtime.kind, "error": repr(exc)})
            continue
        data.append(
            {
                "name": runtime.name,
                "kind": runtime.kind,
                "draining": runtime.name in ctx.pool.drained,
                "models": list(runtime.models),
                "active_model": status.active_model,
                "residency": {m: asdict(r) for m, r in status.models.items()},
                "waiting_calls": status.waiting_calls,
                "running_calls": status.running_calls,
                "kv_utilization": status.kv_utilization,
                "kv_tokens": _kv_tokens(status),
                "sessions_with_kv": len(status.sessions),
                "reserved_sessions": len(status.reserved),
                "reserved": status.reserved,
                "now_s": status.at_s,
                "recent_slots": [asdict(slot) for slot in status.recent_slots],
                "gap_models": {m: asdict(f) for m, f in status.gap_models.items()},
            }
        )
    return json_response({"data": data})


@router.get("/tenants")
async def tenants(request: Request) -> Response:
    """Each tenant's share of the service and its queue now, over the instances
    (proxy/api/tenants.py); an unreachable instance is listed in ``unreachable``."""
    ctx = _admin(request)
    runtimes = ctx.pool.runtimes
    answers = await asyncio.gather(*(r.status() for r in runtimes), return_exceptions=True)
    statuses = {
        r.name: a for r, a in zip(runtimes, answers, strict=True) if isinstance(a, InstanceStatus)
    }
    unreachable = {
        r.name: repr(a)
        for r, a in zip(runtimes, answers, strict=True)
        if isinstance(a, BaseException)
    }
    names = await _read(ctx, ctx.store.tenants.tenant_names)
    return json_response({"data": tenant_shares(statuses, names), "unreachable": unreachable})


def _kv_tokens(status: InstanceStatus) -> dict[str, dict[str, int]]:
    """Tokens of session KV per model and tier ("hbm", "host") on the instance."""
    tiers: dict[str, dict[str, int]] = {}
    for kv in status.sessions.values():
        per_model = tiers.setdefault(kv.model, {"hbm": 0, "host": 0})
        per_model[kv.location] = per_model.get(kv.location, 0) + kv.tokens
    return tiers


@router.post("/instances/{name}/drain")
async def drain_instance(name: str, request: Request) -> Response:
    """Drain a runtime instance: no replica routes new calls to it (its sessions move to
    others, their KV recomputed or restored there); its running calls finish. It stays drained
    (across restarts) until ``/undrain``."""
    return await _set_drain(name, request, draining=True)


@router.post("/instances/{name}/undrain")
async def undrain_instance(name: str, request: Request) -> Response:
    """Route calls to a drained instance again."""
    return await _set_drain(name, request, draining=False)


async def _set_drain(name: str, request: Request, *, draining: bool) -> Response:
    ctx = _admin(request)
    if name not in {r.name for r in ctx.pool.runtimes}:
        raise ApiError(404, f"No runtime instance {name!r}.", code="instance_not_found")
    await _read(ctx, lambda: ctx.store.cluster.set_drain(name, draining, datetime.now(UTC)))
    drained = set(ctx.pool.drained)
    ctx.pool.set_drained(drained | {name} if draining else drained - {name})
    return json_response({"name": name, "draining": draining})


@router.get("/placement")
async def placement(request: Request) -> Response:
    """The placement controller's state (proxy/placement/loop.py ``summary``): its library,
    each runtime's models, the demand it measures, and every move it made with its reason
    and outcome. 404 when the proxy runs without a model library."""
    ctx = _admin(request)
    if ctx.placement is None:
        raise ApiError(
            404,
            "Placement is off: start the proxy with a model library (--placement-library).",
            code="placement_off",
        )
    return json_response(await ctx.placement.summary())
