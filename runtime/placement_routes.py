"""The runtime's placement endpoints: a placement controller adds and removes models on a
running node (issue 28).

- ``POST /v1/runtime/models``: a ``[[model]]`` entry as JSON (``name``, ``engine``, ``path``,
  the engine's options, as in a node config) → 201 once its engine has started and the
  scheduler serves it; 400 for a bad entry (or an unknown catalog model), 409 if the node
  hosts it already, 503 while the runtime drains, 500 if its engine fails to start (what it
  started is shut down; the node is unchanged);
- ``DELETE /v1/runtime/models/{name}`` → 200 once the scheduler has retired it (its calls
  finished, runtime/scheduling/node.py ``retire``) and its engine has shut down; 404 if the
  node does not host it, 409 for the node's last model.

Both answer the node's ``model_names`` after the change; the status document lists them too,
so a proxy routes to the new set on its next status read. Changes run one at a time (engines
start one at a time, as at boot: vLLM's free-memory check).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from talaria.core.catalog import CatalogError
from talaria.runtime.config import NodeConfigError, model_config
from talaria.runtime.factory import ENGINES, EngineStartError, place_model, unplace_model

router = APIRouter()
log = logging.getLogger("talaria.runtime")


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data), status, media_type="application/json")


@router.post("/v1/runtime/models")
async def add_model(request: Request) -> Response:
    """Host one more model (module docstring)."""
    runtime = request.app.state.runtime
    if not runtime.ready:
        return _json({"error": "draining"}, 503)
    try:
        entry = json.loads(await request.body())
        model = model_config(entry, "POST /v1/runtime/models", tuple(ENGINES))
    except (ValueError, NodeConfigError) as exc:
        return _json({"error": str(exc)}, 400)
    async with runtime.changes:
        if model.name in runtime.node.engines:
            return _json({"error": f"model {model.name!r} is already on this node"}, 409)
        try:
            await place_model(runtime.built, runtime.config, model, runtime.catalog)
        except (CatalogError, NodeConfigError) as exc:
            return _json({"error": str(exc)}, 400)
        except EngineStartError as exc:
            log.error("%s", exc)
            return _json({"error": str(exc)}, 500)
    return _json({"ok": True, "model_names": list(runtime.node.engines)}, 201)


@router.delete("/v1/runtime/models/{name}")
async def remove_model(name: str, request: Request) -> Response:
    """Stop hosting a model once its calls are done (module docstring)."""
    runtime = request.app.state.runtime
    async with runtime.changes:
        if name not in runtime.node.engines:
            return _json({"error": f"model {name!r} is not on this node"}, 404)
        if len(runtime.node.engines) == 1:
            return _json({"error": f"model {name!r} is this node's last model"}, 409)
        await unplace_model(runtime.built, name)
    return _json({"ok": True, "model_names": list(runtime.node.engines)})
