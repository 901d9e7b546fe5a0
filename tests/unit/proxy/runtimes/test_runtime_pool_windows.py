"""The context window the proxy checks a prompt against (proxy/runtimes/pool.py
``context_window``): what the runtimes report now, else the catalog's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import pytest

from talaria.core.clock import TimeScale
from talaria.proxy.runtimes.base import RuntimeClient
from talaria.proxy.runtimes.pool import RuntimePool


@dataclass
class Reporting:
    """The part of a runtime client the window reads: the windows its status reported."""

    name: str
    context_windows: dict[str, int] = field(default_factory=dict)


def _pool(*runtimes: Reporting, catalog: dict[str, int] | None = None) -> RuntimePool:
    clients = cast(list[RuntimeClient], list(runtimes))
    return RuntimePool(clients, TimeScale(1.0), catalog)


@pytest.mark.parametrize(
    ("reports", "catalog", "model", "window"),
    [
        ([{"a": 4096}, {"a": 2048}], {"a": 131_072}, "a", 2048),  # the smallest instance's
        ([{"a": 4096}, {}], {"a": 131_072}, "a", 4096),  # one instance reports it
        ([{}, {}], {"a": 131_072}, "a", 131_072),  # none reports it: the catalog's
        ([{"a": 4096}], {}, "b", None),  # known to neither: not checked
    ],
)
def test_the_window_is_the_smallest_reported_else_the_catalogs(
    reports: list[dict[str, int]], catalog: dict[str, int], model: str, window: int | None
) -> None:
    runtimes = [Reporting(f"r{i}", report) for i, report in enumerate(reports)]
    assert _pool(*runtimes, catalog=catalog).context_window(model) == window


def test_a_model_placed_while_the_proxy_runs_is_checked_against_its_engines_window() -> None:
    runtime = Reporting("r0", {"a": 2048})
    pool = _pool(runtime, catalog={"b": 131_072})
    assert pool.context_window("b") == 131_072
    # the runtime's next status read lists the new engine's max_model_len
    runtime.context_windows = {"a": 2048, "b": 8192}
    assert pool.context_window("b") == 8192
