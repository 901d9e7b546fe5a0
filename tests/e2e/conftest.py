"""The e2e tests' shared fixture: ``deployment`` (tests/e2e/replicas.py), PostgreSQL, three
runtime nodes and the proxy replicas a test's ``replicas`` marker asks for (3 by default)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from bench.harness.processes import Postgres, free_port, talaria_runtime
from tests.e2e.replicas import NODE_TOML, NODES, Deployment, marker_replicas


@pytest.fixture
def deployment(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Deployment]:
    """PostgreSQL, the runtime nodes (their simulated clock 50× real time, or the test's
    ``time_scale`` marker) and three replicas, every replica seeing the others."""
    marker = request.node.get_closest_marker("time_scale")
    scale = marker.args[0] if marker else 50
    pg = Postgres(Path(tempfile.mkdtemp(prefix="talaria-pg-")), free_port())
    url = pg.start()
    try:
        with ExitStack() as stack:
            runtimes = {}
            for name in NODES:
                config = tmp_path / f"{name}.toml"
                config.write_text(NODE_TOML.format(name=name, scale=scale))
                runtimes[name] = stack.enter_context(talaria_runtime(config))
            args = ["--database-url", url]
            for runtime in runtimes.values():
                args += ["--runtime", runtime.base_url]
            deployment = Deployment([], runtimes, url, stack, args, tmp_path)
            for _ in range(marker_replicas(request)):
                deployment.add_replica()
            yield deployment
    finally:
        pg.stop()
