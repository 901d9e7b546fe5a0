"""The runtime server: one node's engines and slot scheduler behind an internal HTTP API
(``create_runtime_app``; runtime/serve.py serves it).

Endpoints (the proxy's ``HttpRuntime`` speaks them), each in its route module:

- ``POST /v1/runtime/generate``: a call document → NDJSON, one event document per line
  (core/protocol_calls.py, protocol_events.py): runtime/call_routes.py;
- ``GET /v1/runtime/status``: the status document (core/protocol_status.py): ``InstanceStatus`` plus
  ``model_names`` (in order), ``slots`` (the latest slots: model, start, switch seconds, end,
  close reason, admissions), per-model ``engines`` info, and for a placement controller
  ``draining_models``, ``weight_budget_bytes`` (runtime/memory/sizing.py
  ``pinned_weight_budget_bytes``) and ``quantum_s``: runtime/status_routes.py;
- ``POST /v1/runtime/sessions/<key>/hint`` (``{"expected_gap_s": float}``), ``.../end``,
  ``.../moved`` (the key may hold ``/``: a thread's), and ``POST /v1/runtime/ends`` (several
  sessions ended at once): core/protocol_sessions.py, runtime/call_routes.py;
- ``POST /v1/runtime/models``, ``POST /v1/runtime/models/{name}/drain``,
  ``DELETE /v1/runtime/models/{name}``, ``GET /v1/runtime/demand``: placement
  (runtime/placement_routes.py);
- ``GET /healthz`` (liveness: 503 while the event loop is blocked and for a minute after,
  core/loop_watchdog.py), ``GET /readyz`` (engines started, not draining):
  runtime/status_routes.py. Both answer 503 with the reason once the node's scheduling loop
  has ended (``NodeScheduler.failure``: it raised); so do ``status`` (every proxy leaves the
  runtime out), ``generate`` and placement, and the calls that were waiting fail with it: a
  supervisor restarts the process.

Who may call: with a ``token`` (``talaria runtime`` reads ``TALARIA_RUNTIME_TOKEN``) every
route but the two probes answers 401 without ``Authorization: Bearer <token>``
(runtime/auth.py, around the whole app, so a route added here is covered too). Without one the
API is open to anyone who reaches the port — placement loads model files, session control
acts on any session, ``generate`` runs with no tenant or quota — so ``talaria runtime``
refuses a non-loopback ``--host`` without a token. A model placed over HTTP is held to the
operator's ``PlacementRules`` (runtime/placement_rules.py: its keys, its paths inside
``--models-dir``, no ``trust_remote_code`` unless allowed); the node's own config is trusted.

A request body that takes longer than ``BODY_TIMEOUT_S`` to arrive gets 408 (core/body_deadline.py);
``talaria runtime`` bounds request heads and connections too (runtime/serve.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response

from talaria.core.body_deadline import BODY_TIMEOUT_S, BodyDeadline, BodyTimeout
from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock
from talaria.core.loop_watchdog import LoopWatchdog
from talaria.runtime.app_state import RuntimeState, json_response
from talaria.runtime.auth import RuntimeAuth
from talaria.runtime.call_routes import router as call_router
from talaria.runtime.config import NodeConfig
from talaria.runtime.engine import Engine
from talaria.runtime.factory import BuiltNode, build_node_from_config
from talaria.runtime.placement_routes import router as placement_router
from talaria.runtime.placement_rules import PlacementRules
from talaria.runtime.status_routes import router as status_router

log = logging.getLogger("talaria.runtime")


def create_runtime_app(
    config: NodeConfig,
    catalog_paths: list[str] | None = None,
    *,
    token: str | None = None,
    rules: PlacementRules | None = None,
) -> FastAPI:
    """The runtime's FastAPI app (endpoints in the module docstring). Its lifespan builds the
    node from ``config`` and the catalog, starts the engines one at a time and then the
    scheduler, and at the end stops the scheduler and shuts the engines down. ``token``:
    the bearer token every route but the probes needs (None: open); ``rules``: what a model
    placed over HTTP may hold (default: no paths, no remote code)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        clock = LoopClock(config.time_scale)
        catalog = load_catalog(catalog_paths or [])
        built: BuiltNode = build_node_from_config(config, catalog, clock)
        started: list[Engine] = []
        try:
            for name, engine in built.engines.items():  # one at a time (vLLM's memory check)
                log.info("starting engine %s", name)
                await engine.start()
                started.append(engine)
        except BaseException:  # the runtime will not serve: stop what started (its processes)
            for engine in started:
                await engine.shutdown()
            raise
        built.node.start()
        watchdog = LoopWatchdog()
        watchdog.start()
        state = RuntimeState(config, built, catalog, watchdog, rules or PlacementRules(), True)
        app.state.runtime = state
        try:
            yield
        finally:
            watchdog.stop()
            state.ready = False
            await built.node.stop()
            for engine in list(built.engines.values()):
                await engine.shutdown()

    app = FastAPI(title="Talaria runtime", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.include_router(placement_router)
    app.include_router(status_router)
    app.include_router(call_router)
    app.add_middleware(BodyDeadline, timeout_s=BODY_TIMEOUT_S)
    app.add_middleware(RuntimeAuth, token=token)  # the outermost: before anything else runs

    @app.exception_handler(BodyTimeout)
    async def body_timeout(request: Request, exc: BodyTimeout) -> Response:
        response = json_response({"error": str(exc)}, 408)
        response.headers["connection"] = "close"
        return response

    return app
