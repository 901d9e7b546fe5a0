"""The runtime's probes and its status document:

- ``GET /healthz`` (liveness: 503 while the event loop is blocked and for a minute after,
  core/loop_watchdog.py), ``GET /readyz`` (engines started, not draining). Both answer 503
  with the reason once the node's scheduling loop has ended (``NodeScheduler.failure``);
- ``GET /v1/runtime/status``: the status document (core/protocol_status.py), as strict JSON
  (``_status_response``); 503 once the node's loop has ended (every proxy then leaves the
  runtime out of routing). Its ``engines`` entry per model is the engine's ``EngineInfo``,
  plus ``preemptions`` for an engine that applies the fair queue's rule 5 (``StepsByClass``:
  times a running call was held out of an iteration for a higher class).
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from talaria.core.protocol_status import status_to_dict
from talaria.core.status import status_json
from talaria.runtime.app_state import RuntimeState, json_response, runtime_of
from talaria.runtime.engine import Engine, StepsByClass
from talaria.runtime.memory.sizing import pinned_weight_budget_bytes

router = APIRouter()
log = logging.getLogger("talaria.runtime")

STATUS_SLOTS = 100
"""How many of the latest slots ``/v1/runtime/status`` lists in ``slots`` (model, times,
admissions); its ``recent_slots`` holds ``core.status.RECENT_SLOTS``."""


@router.get("/healthz")
async def healthz(request: Request) -> Response:
    """Liveness: the event loop's health and the node's loop (module docstring)."""
    runtime = runtime_of(request)
    loop, failure = runtime.watchdog.health(), runtime.node.failure
    body: dict[str, Any] = {"ok": loop["ok"] and failure is None, "loop": loop}
    if failure is not None:
        body["node"] = failure
    return json_response(body, 200 if body["ok"] else 503)


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    """Readiness: engines started, not draining, the node's loop running."""
    runtime = runtime_of(request)
    failure = runtime.node.failure
    body: dict[str, Any] = {"ready": runtime.ready and failure is None}
    if failure is not None:
        body["error"] = failure
    return json_response(body, 200 if body["ready"] else 503)


@router.get("/v1/runtime/status")
async def status(request: Request) -> Response:
    """The status document (module docstring)."""
    runtime = runtime_of(request)
    node = runtime.node
    if node.failure is not None:  # every proxy leaves this runtime out of routing
        return json_response({"error": node.failure}, 503)
    slots = [
        {
            "model": s.model,
            "start_s": s.start_s,
            "switch_s": s.switch_s,
            "end_s": s.end_s,
            "close": s.close.value if s.close else None,
            "admitted": s.admitted,
            "sp_admitted": s.sp_admitted,
        }
        for s in node.slots[-STATUS_SLOTS:]
    ]
    engines = {name: _engine_entry(e) for name, e in node.engines.items()}
    return _status_response(
        runtime,
        status_to_dict(
            node.status(),
            model_names=[m for m in node.engines if m not in runtime.leaving],
            slots=slots,
            engines=engines,
            draining_models=sorted(runtime.draining),
            weight_budget_bytes=pinned_weight_budget_bytes(
                runtime.config.server_spec(runtime.catalog)
            ),
            quantum_s=runtime.config.quantum_s,
            server=runtime.config.server,
            gpus=runtime.config.server_spec(runtime.catalog).gpus,
        ),
    )


def _engine_entry(engine: Engine) -> dict[str, Any]:
    """An engine's ``engines`` entry (the module docstring)."""
    entry = asdict(engine.info())
    if isinstance(engine, StepsByClass):
        entry["preemptions"] = engine.preemptions
    return entry


def _status_response(runtime: RuntimeState, document: dict[str, Any]) -> Response:
    """The status document as strict JSON: an entry holding a NaN or an infinity is left out
    (core/status.py ``status_json``; logged when the set changes), so that one bad model's
    estimate never makes a proxy refuse the whole document and drop the runtime."""
    body, unlisted = status_json(document)
    if tuple(unlisted) != runtime.unlisted:
        runtime.unlisted = tuple(unlisted)
        if unlisted:
            log.error("status: %s left out: a number that is not finite", unlisted)
    return Response(body, media_type="application/json")
