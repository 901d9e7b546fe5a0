"""``GET /v1/models``: the models some instance hosts, and with a placement controller those
of its library (a call starts one no instance hosts: proxy/placement/loop.py; its
``instances`` list is empty until then), in OpenAI's list shape or, when the caller sends
``anthropic-version``, in Anthropic's.

In OpenAI's shape each model also says its ``state``: ``warm`` when some instance hosts it,
``cold`` when none does (a library model: its first call waits for its cold start, bounded by
``TALARIA_PLACEMENT_COLD_START_TIMEOUT_S``, and a start that fails is a 503 with Retry-After
and the reason, never a 404), and a cold one its ``cold_start_s``: the placement loop's
expected cold start (``PlacementLoop.expected_cold_start_s``; null when no runtime says its
server)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from talaria.proxy.callpath.context import context, json_response
from talaria.proxy.callpath.door import tenant_of
from talaria.proxy.placement.loop import PlacementLoop

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request) -> Response:
    """OpenAI's model list; Anthropic's shape when the caller sends ``anthropic-version``."""
    ctx = context(request)
    await tenant_of(ctx, request)
    residency = await ctx.pool.residency()
    names = ctx.pool.models()
    if ctx.placement is not None:
        names = sorted(set(names) | set(ctx.placement.library))
    data: list[dict[str, object]]
    if request.headers.get("anthropic-version"):
        data = [
            {
                "type": "model",
                "id": m,
                "display_name": m,
                "created_at": "1970-01-01T00:00:00Z",
                "context_window": ctx.pool.context_window(m),
            }
            for m in names
        ]
        first, last = (names[0], names[-1]) if names else (None, None)
        return json_response({"data": data, "has_more": False, "first_id": first, "last_id": last})
    data = [
        {
            "id": m,
            "object": "model",
            "created": 0,
            "owned_by": "talaria",
            "context_window": ctx.pool.context_window(m),
            "instances": residency.get(m, []),
            **_warmth(ctx.placement, m, bool(residency.get(m))),
        }
        for m in names
    ]
    return json_response({"object": "list", "data": data})


def _warmth(placement: PlacementLoop | None, model: str, hosted: bool) -> dict[str, object]:
    """``state`` (warm, cold) and, for a cold model, its expected ``cold_start_s``."""
    if hosted or placement is None:
        return {"state": "warm" if hosted else "cold"}
    expected = placement.expected_cold_start_s(model)
    return {"state": "cold", "cold_start_s": None if expected is None else round(expected, 1)}
