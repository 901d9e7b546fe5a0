"""``GET /v1/models``: the models some instance hosts, and with a placement controller those
of its library (a call starts one no instance hosts: proxy/placement/loop.py; its
``instances`` list is empty until then), in OpenAI's list shape or, when the caller sends
``anthropic-version``, in Anthropic's."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from talaria.proxy.callpath.context import context, json_response
from talaria.proxy.callpath.door import tenant_of

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
        }
        for m in names
    ]
    return json_response({"object": "list", "data": data})
