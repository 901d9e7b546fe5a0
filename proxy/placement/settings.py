"""Placement's settings (proxy/placement/loop.py), beside it: ``TALARIA_PLACEMENT_*``, or the
arguments given to ``ProxySettings`` (``talaria serve --placement-library``); read with
``PlacementSettings.of(settings)`` (proxy/contract/settings.py ``PluginSettings``)."""

from __future__ import annotations

from pydantic import Field

from talaria.core.placement import PlacementConfig
from talaria.proxy.contract.settings import PluginSettings


class PlacementSettings(PluginSettings):
    """The placement controller's library and pace (docs/operations.md, "Placement")."""

    placement_library: str | None = Field(
        None,
        description="A TOML file of [[model]] entries (as in a node config, paths as the "
        "runtimes see them, optional weight_bytes): with runtime servers, a placement "
        "controller adds, drains and removes these models on them by demand, and a call "
        "for one that no runtime hosts waits for its cold start instead of a 404",
    )
    placement_interval_s: float = Field(
        60.0, gt=0, description="How often the placement controller looks (clock seconds)"
    )
    placement_window_s: float = Field(
        300.0, gt=0, description="Demand is the sessions with a call this far back (s)"
    )
    placement_min_hold_s: float = Field(
        900.0, ge=0, description="A placed model stays at least this long before a drain (s)"
    )
    placement_drain_s: float = Field(
        600.0,
        ge=0,
        description="A drained model's sessions keep its runtime this long at most, then it "
        "is removed (s)",
    )
    placement_keep_alive_s: float | None = Field(
        None,
        gt=0,
        description="Scale to zero: a library model without calls for its keep-alive (learned "
        "from its own calls, at least this many seconds, at most the demand window) and "
        "without live sessions on a runtime is removed there, and cold-started again by its "
        "next call; unset: placed models stay",
    )
    placement_cold_start_timeout_s: float = Field(
        900.0, gt=0, description="How long a call waits for its model's cold start (s)"
    )

    def config(self) -> PlacementConfig:
        """The controller's pace (core/placement/)."""
        return PlacementConfig(
            interval_s=self.placement_interval_s,
            window_s=self.placement_window_s,
            min_hold_s=self.placement_min_hold_s,
            drain_s=self.placement_drain_s,
        )
