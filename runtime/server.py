"""The runtime server: one node's engines and slot scheduler behind an internal HTTP API.

Endpoints (the proxy's ``HttpRuntime`` speaks them):

- ``POST /v1/runtime/generate``: a call document → NDJSON, one event document per line
  (core/protocol.py has both);
- ``GET /v1/runtime/status``: the status document (core/protocol.py): ``InstanceStatus`` plus
  ``model_names`` (in order), ``slots`` (the latest slots: model, start, switch seconds, end,
  close reason, admissions), per-model ``engines`` info, and for a placement controller
  ``draining_models``, ``weight_budget_bytes`` (runtime/factory.py
  ``pinned_weight_budget_bytes``) and ``quantum_s``;
- ``POST /v1/runtime/sessions/<key>/hint`` (``{"expected_gap_s": float}``), ``.../end``,
  ``.../moved`` (the key may hold ``/``: a thread's), and ``POST /v1/runtime/ends`` (several
  sessions ended at once): core/protocol_sessions.py;
- ``POST /v1/runtime/models``, ``POST /v1/runtime/models/{name}/drain``,
  ``DELETE /v1/runtime/models/{name}``, ``GET /v1/runtime/demand``: placement
  (runtime/placement_routes.py);
- ``GET /healthz`` (liveness: 503 while the event loop is blocked and for a minute after,
  core/loop_watchdog.py), ``GET /readyz`` (engines started, not draining). Both answer 503
  with the reason once the node's scheduling loop has ended (``NodeScheduler.failure``: it
  raised); so do ``status`` (every proxy leaves the runtime out), ``generate`` and placement,
  and the calls that were waiting fail with it: a supervisor restarts the process.

Who may call: with a ``token`` (``talaria runtime`` reads ``TALARIA_RUNTIME_TOKEN``) every
route but the two probes answers 401 without ``Authorization: Bearer <token>``
(runtime/auth.py, around the whole app, so a route added here is covered too). Without one the
API is open to anyone who reaches the port — placement loads model files, session control
acts on any session, ``generate`` runs with no tenant or quota — so ``talaria runtime``
refuses a non-loopback ``--host`` without a token. A model placed over HTTP is held to the
operator's ``PlacementRules`` (runtime/placement_rules.py: its keys, its paths inside
``--models-dir``, no ``trust_remote_code`` unless allowed); the node's own config is trusted.

Draining (:func:`serve_runtime`): on SIGTERM uvicorn stops accepting connections and waits up
to the drain timeout D for in-flight requests — streams included — before the lifespan stops
the node and shuts the engines down; readiness reports 503 from then on. The signal also arms
an exit deadline at D + ``ENGINE_SHUTDOWN_S``: a process whose loop is blocked, or whose engines
do not stop, is ended then.

A request body that takes longer than ``BODY_TIMEOUT_S`` to arrive gets 408 (core/body_deadline.py);
``talaria runtime`` bounds request heads and connections too (core/http_edge.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from types import FrameType
from typing import Any

import msgspec
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from talaria.core.body_deadline import BODY_TIMEOUT_S, BodyDeadline, BodyTimeout
from talaria.core.catalog import Catalog, load_catalog
from talaria.core.clock import LoopClock
from talaria.core.http_edge import BoundedConfig, EdgeBounds
from talaria.core.loop_watchdog import ExitDeadline, LoopWatchdog
from talaria.core.placement import DemandMeter
from talaria.core.protocol import (
    ErrorEvent,
    ProtocolError,
    event_to_dict,
    request_from_dict,
    status_to_dict,
)
from talaria.core.protocol_sessions import (
    ENDS_ROUTE,
    SESSION_ACTIONS,
    SESSION_ROUTE,
    ends_from_dict,
    session_key_ok,
)
from talaria.core.status import status_json
from talaria.core.types import (
    CallRejected,
    CallRequest,
    Finished,
    GenerationEvent,
)
from talaria.runtime.auth import RuntimeAuth
from talaria.runtime.config import NodeConfig
from talaria.runtime.engine import Engine
from talaria.runtime.factory import BuiltNode, build_node_from_config
from talaria.runtime.memory.sizing import pinned_weight_budget_bytes
from talaria.runtime.placement_routes import DEMAND_HORIZON_S
from talaria.runtime.placement_routes import router as placement_router
from talaria.runtime.placement_rules import PlacementRules
from talaria.runtime.scheduling.node import NodeScheduler, NodeStopped, UnknownModelError

log = logging.getLogger("talaria.runtime")

ENGINE_SHUTDOWN_S = 30.0
"""After the drain timeout, what stopping the node and shutting the engines down gets (vLLM's
engine shutdown takes seconds per engine) before the process is ended."""

STATUS_SLOTS = 100
"""How many of the latest slots ``/v1/runtime/status`` lists in ``slots`` (model, times,
admissions); its ``recent_slots`` holds ``core.status.RECENT_SLOTS``."""


@dataclass
class RuntimeState:
    """What the routes read: the node's config, the built node (its scheduler and engines),
    the catalog, the loop watchdog, and whether it is ready (engines started, not draining)."""

    config: NodeConfig
    built: BuiltNode
    catalog: Catalog
    watchdog: LoopWatchdog
    rules: PlacementRules
    """What a model placed over HTTP may hold (runtime/placement_routes.py)."""
    ready: bool = False
    changes: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while a model is added or removed (runtime/placement_routes.py)."""
    draining: dict[str, float] = field(default_factory=dict)
    """Model → when (node clock seconds) a placement controller began draining it."""
    leaving: set[str] = field(default_factory=set)
    """Models being removed: no longer listed in the status's ``model_names``."""
    demand: DemandMeter = field(default_factory=lambda: DemandMeter(DEMAND_HORIZON_S))
    """Every call's session as it comes and its engine time as it ends, for a placement
    controller (``GET /v1/runtime/demand``: runtime/placement_routes.py)."""
    unlisted: tuple[str, ...] = ()
    """The status entries the last status read left out (a NaN or an infinity: logged when
    the set changes)."""

    @property
    def node(self) -> NodeScheduler:
        """The node's scheduler."""
        return self.built.node


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data), status, media_type="application/json")


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
    app.add_middleware(BodyDeadline, timeout_s=BODY_TIMEOUT_S)
    app.add_middleware(RuntimeAuth, token=token)  # the outermost: before anything else runs

    @app.exception_handler(BodyTimeout)
    async def body_timeout(request: Request, exc: BodyTimeout) -> Response:
        response = _json({"error": str(exc)}, 408)
        response.headers["connection"] = "close"
        return response

    def state_of(request: Request) -> RuntimeState:
        runtime: RuntimeState = request.app.state.runtime
        return runtime

    @app.get("/healthz")
    async def healthz(request: Request) -> Response:
        runtime = state_of(request)
        loop, failure = runtime.watchdog.health(), runtime.node.failure
        body: dict[str, Any] = {"ok": loop["ok"] and failure is None, "loop": loop}
        if failure is not None:
            body["node"] = failure
        return _json(body, 200 if body["ok"] else 503)

    @app.get("/readyz")
    async def readyz(request: Request) -> Response:
        runtime = state_of(request)
        failure = runtime.node.failure
        body: dict[str, Any] = {"ready": runtime.ready and failure is None}
        if failure is not None:
            body["error"] = failure
        return _json(body, 200 if body["ready"] else 503)

    @app.get("/v1/runtime/status")
    async def status(request: Request) -> Response:
        runtime = state_of(request)
        node = runtime.node
        if node.failure is not None:  # every proxy leaves this runtime out of routing
            return _json({"error": node.failure}, 503)
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
        engines = {name: asdict(e.info()) for name, e in node.engines.items()}
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

    @app.post("/v1/runtime/generate")
    async def generate(request: Request) -> Response:
        runtime = state_of(request)
        if not runtime.ready or runtime.node.failure is not None:
            return _json({"error": runtime.node.failure or "draining"}, 503)
        try:
            call = request_from_dict(msgspec.json.decode(await request.body()))
        except (ProtocolError, msgspec.DecodeError, RecursionError) as exc:
            return _json({"error": str(exc)}, 400)
        if call.model not in runtime.node.engines:
            return _json({"error": f"model {call.model!r} is not on this node"}, 404)
        runtime.demand.arrived(runtime.node.clock.now(), call.model, call.session_key)
        events = _events(runtime.node, call, runtime.demand)
        return StreamingResponse(events, media_type="application/x-ndjson")

    @app.post(SESSION_ROUTE)
    async def session_control(session_key: str, action: str, request: Request) -> Response:
        node = state_of(request).node
        if action not in SESSION_ACTIONS:
            return _json({"error": f"unknown session action {action!r}"}, 404)
        if not session_key_ok(session_key):
            return _json({"error": "a session key is 1 to 256 characters"}, 400)
        if action == "hint":
            gap_s = _gap_s(await request.body())
            if gap_s is None:
                return _json({"error": "expected_gap_s must be a finite, non-negative number"}, 400)
            node.hint(session_key, gap_s)
        elif action == "end":
            node.end_session(session_key)
        else:
            node.session_moved(session_key)
        return _json({"ok": True})

    @app.post(ENDS_ROUTE)
    async def ends(request: Request) -> Response:
        try:
            keys = ends_from_dict(msgspec.json.decode(await request.body()))
        except (ProtocolError, msgspec.DecodeError, RecursionError) as exc:
            return _json({"error": str(exc)}, 400)
        node = state_of(request).node
        for key in keys:
            node.end_session(key)
        return _json({"ok": True, "ended": len(keys)})

    return app


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


def _gap_s(raw: bytes) -> float | None:
    """A hint body's ``expected_gap_s`` in seconds, or None unless it is a finite number ≥ 0
    (JSON parsers take ``NaN`` and ``Infinity``; neither may reach the reservation)."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    gap = body.get("expected_gap_s") if isinstance(body, dict) else None
    if isinstance(gap, bool) or not isinstance(gap, int | float):
        return None
    try:
        seconds = float(gap)
    except OverflowError:  # an integer past float's range
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


class _DeadlineServer(uvicorn.Server):
    """uvicorn that arms an exit deadline when told to exit."""

    def __init__(self, config: uvicorn.Config, exit_after_s: float) -> None:
        super().__init__(config)
        self._exit_after_s = exit_after_s
        self._deadline = ExitDeadline()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._deadline.arm(self._exit_after_s)
        super().handle_exit(sig, frame)


def serve_runtime(
    app: FastAPI, host: str, port: int, log_level: str, drain_timeout_s: float
) -> None:
    """Run the runtime server until SIGTERM / SIGINT, then drain within ``drain_timeout_s``;
    the process ends by ``drain_timeout_s + ENGINE_SHUTDOWN_S`` whatever happens."""
    # loop="asyncio": the scheduler's clock is loop.time(), which uvloop rounds to whole
    # milliseconds; the standard loop reads time.monotonic(), fine enough to time engine steps.
    config = BoundedConfig(
        app,
        EdgeBounds(),
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=max(1, math.ceil(drain_timeout_s)),
        loop="asyncio",
    )
    _DeadlineServer(config, drain_timeout_s + ENGINE_SHUTDOWN_S).run()


async def _events(
    node: NodeScheduler, call: CallRequest, demand: DemandMeter
) -> AsyncIterator[bytes]:
    """The call's events as NDJSON lines; a failure ends the stream with an ``ErrorEvent``
    line (the 200 has already gone out). A finished call's engine time goes to ``demand``."""

    def line(event: GenerationEvent | ErrorEvent) -> bytes:
        return msgspec.json.encode(event_to_dict(event)) + b"\n"

    try:
        # closed with this generator (the proxy went away): the call's generation stops too
        async with contextlib.aclosing(node.stream(call)) as events:
            async for event in events:
                yield line(event)
                if isinstance(event, Finished):
                    result = event.result
                    seconds = result.finished_s - result.admitted_s
                    demand.finished(node.clock.now(), call.model, seconds)
                    return
    except (UnknownModelError, NodeStopped) as exc:
        yield line(ErrorEvent(str(exc)))
    except CallRejected as exc:  # the caller's fault: the proxy answers 400 with the code
        yield line(ErrorEvent(str(exc), exc.code, exc.param))
    except Exception as exc:  # reported to the proxy, which fails this call only
        log.exception("call %s failed", call.request_id)
        yield line(ErrorEvent(repr(exc)))
