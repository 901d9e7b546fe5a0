"""The runtime's placement endpoints: a placement controller adds and removes models on a
running node (issue 28).

- ``POST /v1/runtime/models``: a ``[[model]]`` entry as JSON (``name``, ``engine``, ``path``,
  the engine's options, as in a node config) → 201 once its engine has started and the
  scheduler serves it; 400 for a bad entry (a name outside the catalog's grammar, a field its
  table refuses: runtime/config_fields.py; or an unknown catalog model), or one the
  operator's rules refuse (runtime/placement_rules.py: an option its engine does not list, a
  path outside ``--models-dir``, ``trust_remote_code`` not allowed, an upstream URL outside
  ``--allow-upstream-url``, a catalog model's name for another model), 409 if the node hosts
  it already, 503 while the runtime drains or once its node's loop has ended, 500 if its
  engine fails to start (what it started is shut down; the node is unchanged; the error names
  the fault or the bound an upstream passed, never what it sent:
  runtime/engines/upstream/client.py);
- ``POST /v1/runtime/models/{name}/drain`` → 200: the model is marked *draining* (the status
  document lists it in ``draining_models``): every proxy routes no new session to it here
  while another node serves it, and its sessions here stay until they end (the controller
  then removes it); the node itself serves every call it gets as before; 404 if the node
  does not host it;
- ``DELETE /v1/runtime/models/{name}`` → 200 once the scheduler has retired it (its calls
  finished, runtime/scheduling/node.py ``retire``) and its engine has shut down (its drain
  mark goes with it); 404 if the node does not host it, 409 for the node's last model, 503
  at once if the node's loop has ended (nothing would retire it). The
  status stops listing it in ``model_names`` ``LEAVE_GRACE_S`` before the retirement begins,
  so that every proxy has read a status without it (and routes its calls elsewhere) before
  a call of it would be refused; a call that comes meanwhile is still served.

- ``GET /v1/runtime/demand?window_s=W`` → each model's demand over the last W clock seconds
  (at most an hour): ``demand``, the distinct sessions with a call (core/placement/demand.py
  ``d_m``), ``call_s``, the mean engine time of the calls that finished, and
  ``finished_calls``, their number (a controller merges several runtimes' means by it).
  Every proxy replica's calls come here, so the controller reads all of them.

The changes answer the node's ``model_names``; the status document lists them too,
so a proxy routes to the new set on its next status read. Changes run one at a time (engines
start one at a time, as at boot: vLLM's free-memory check).
"""

from __future__ import annotations

import asyncio
import json
import logging

from fastapi import APIRouter, Request
from fastapi.responses import Response

from talaria.core.catalog_error import CatalogError
from talaria.runtime.app_state import DEMAND_HORIZON_S, json_response, runtime_of
from talaria.runtime.config import NodeConfigError, model_config
from talaria.runtime.engine_kinds import ENGINES, engine_fields
from talaria.runtime.factory import EngineStartError, place_model, unplace_model
from talaria.runtime.placement_rules import check_served, placed_model

router = APIRouter()
LEAVE_GRACE_S = 1.0
"""Wall seconds between unlisting a model and retiring it: longer than a proxy reuses a status
(``TALARIA_STATUS_TTL_S``, 0.05 s, plus ``TALARIA_STATUS_STALE_S``, 0 s, by default)."""
log = logging.getLogger("talaria.runtime")


@router.post("/v1/runtime/models")
async def add_model(request: Request) -> Response:
    """Host one more model (module docstring)."""
    runtime = runtime_of(request)
    if not runtime.ready or runtime.node.failure is not None:
        return json_response({"error": runtime.node.failure or "draining"}, 503)
    try:
        entry = json.loads(await request.body())
        model = model_config(entry, "POST /v1/runtime/models", engine_fields())
        model = placed_model(model, ENGINES[model.engine].options, runtime.rules)
        check_served(model, ENGINES[model.engine].options, runtime.catalog)
    except (ValueError, NodeConfigError) as exc:
        return json_response({"error": str(exc)}, 400)
    async with runtime.changes:
        if model.name in runtime.node.engines:
            return json_response({"error": f"model {model.name!r} is already on this node"}, 409)
        try:
            await place_model(runtime.built, runtime.config, model, runtime.catalog)
        except (CatalogError, NodeConfigError) as exc:
            return json_response({"error": str(exc)}, 400)
        except EngineStartError as exc:
            log.error("%s", exc)
            return json_response({"error": str(exc)}, 500)
    return json_response({"ok": True, "model_names": list(runtime.node.engines)}, 201)


@router.get("/v1/runtime/demand")
async def demand(request: Request, window_s: float = 300.0) -> Response:
    """The models' demand over the last ``window_s`` (module docstring)."""
    if not 0 < window_s <= DEMAND_HORIZON_S:
        return json_response({"error": f"window_s must be in (0, {DEMAND_HORIZON_S:g}]"}, 400)
    runtime = runtime_of(request)
    meter, now = runtime.demand, runtime.node.clock.now()
    return json_response(
        {
            "window_s": window_s,
            "demand": meter.demand(now, window_s),
            "call_s": meter.call_s(now, window_s),
            "finished_calls": meter.finished_calls(now, window_s),
            "idle_s": meter.idle_s(now),
            "gap_p99_s": meter.gap_p99_s(now, window_s),
        }
    )


@router.post("/v1/runtime/models/{name}/drain")
async def drain_model(name: str, request: Request) -> Response:
    """Mark a model draining (module docstring)."""
    runtime = runtime_of(request)
    if name not in runtime.node.engines:
        return json_response({"error": f"model {name!r} is not on this node"}, 404)
    runtime.draining.setdefault(name, runtime.node.clock.now())
    return json_response({"ok": True, "draining_models": sorted(runtime.draining)})


@router.delete("/v1/runtime/models/{name}")
async def remove_model(name: str, request: Request) -> Response:
    """Stop hosting a model once its calls are done (module docstring)."""
    runtime = runtime_of(request)
    if runtime.node.failure is not None:  # no loop to retire it: restart the runtime
        return json_response({"error": runtime.node.failure}, 503)
    async with runtime.changes:
        if name not in runtime.node.engines:
            return json_response({"error": f"model {name!r} is not on this node"}, 404)
        if len(runtime.node.engines) == 1:
            return json_response({"error": f"model {name!r} is this node's last model"}, 409)
        runtime.leaving.add(name)
        try:
            await asyncio.sleep(LEAVE_GRACE_S)
            await unplace_model(runtime.built, name)
        finally:
            runtime.leaving.discard(name)
            runtime.draining.pop(name, None)
    return json_response({"ok": True, "model_names": list(runtime.node.engines)})
