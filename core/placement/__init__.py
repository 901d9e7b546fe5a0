"""Placement of models on nodes by demand (issue 28): the pure controller and the table of
where each model is now, shared by the simulator and a live proxy."""

from talaria.core.placement.controller import (
    FleetView,
    Move,
    MoveKind,
    NodeView,
    PlacementConfig,
    Reason,
    decide,
    node_wait,
    replicas,
)
from talaria.core.placement.demand import DemandMeter
from talaria.core.placement.table import PlacementTable

__all__ = [
    "DemandMeter",
    "FleetView",
    "Move",
    "MoveKind",
    "NodeView",
    "PlacementConfig",
    "PlacementTable",
    "Reason",
    "decide",
    "node_wait",
    "replicas",
]
