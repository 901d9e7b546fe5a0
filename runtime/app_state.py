"""What the runtime's routes share: the state they read (``RuntimeState``: the node's config,
the built node, the catalog, readiness, placement's marks and the demand meter), how a route
reaches it (``runtime_of``), and their JSON answers (``json_response``).

runtime/server.py's app makes the state when its lifespan has built the node; the routes
(runtime/status_routes.py, call_routes.py, placement_routes.py) read it from the request.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from talaria.core.catalog import Catalog
from talaria.core.loop_watchdog import LoopWatchdog
from talaria.core.placement import DemandMeter
from talaria.runtime.config import NodeConfig
from talaria.runtime.factory import BuiltNode
from talaria.runtime.placement_rules import PlacementRules
from talaria.runtime.scheduling.node import NodeScheduler

DEMAND_HORIZON_S = 3600.0
"""The longest window a placement controller may read demand over (clock seconds)."""


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


def runtime_of(request: Request) -> RuntimeState:
    """The state of the app serving ``request``."""
    runtime: RuntimeState = request.app.state.runtime
    return runtime


def json_response(data: Any, status: int = 200) -> Response:
    """``data`` as a JSON answer with HTTP ``status``."""
    return Response(json.dumps(data), status, media_type="application/json")
