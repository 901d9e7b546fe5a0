"""A deployment of several proxy replicas on one PostgreSQL in front of three runtime nodes, all
real processes on loopback, for the e2e tests of replicas (test_replicas.py,
test_ingress_affinity.py, test_placement_replicas.py; the ``deployment`` fixture is in
tests/e2e/conftest.py), and the sessions they send."""

from __future__ import annotations

import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.harness.processes import ServeProcess, free_port, talaria_serve
from talaria.proxy.cluster.owner import owner, route_key
from tests.support import admin_get

STOPPED_BY_SIGTERM = (0, -15)
"""uvicorn shuts down cleanly, then re-raises the signal it caught, so the process ends as if
killed by SIGTERM (-15) after "Finished server process"."""
ADMIN = "replicas-admin-token"
CLUSTER_SECRET = "replicas-cluster-secret-0123456789abcdef"
MODEL = "glm-4.5-fp8"
NODE_TOML = """
[node]
name = "{name}"
policy = "talaria"
time_scale = {scale}

[[model]]
name = "glm-4.5-fp8"
engine = "sim"
"""
NODES = ("node-a", "node-b", "node-c")


@dataclass
class Deployment:
    replicas: list[ServeProcess]
    runtimes: dict[str, ServeProcess]
    database_url: str
    stack: ExitStack
    serve_args: list[str]
    data: Path

    def add_replica(self, port: int | None = None, **env: str) -> ServeProcess:
        """Start one more replica (as an autoscaler would; ``env``: more settings) and wait
        until all see it."""
        port = port or free_port()
        env = {
            "TALARIA_REPLICA_URL": f"http://127.0.0.1:{port}",
            "TALARIA_ADMIN_TOKEN": ADMIN,
            "TALARIA_CLUSTER_SECRET": CLUSTER_SECRET,
            "TALARIA_REPLICA_HEARTBEAT_S": "0.2",
            **env,
        }
        data = self.data / f"replica{len(self.replicas)}"
        data.mkdir()
        served = self.stack.enter_context(talaria_serve(self.serve_args, env, data, port=port))
        self.replicas.append(served)
        wait_for_peers(self)
        return served

    def admin(self, replica: int, path: str) -> Any:
        """GET ``path`` of the admin API of replica ``replica``, as JSON."""
        return admin_get(self.replicas[replica].base_url, ADMIN, path)


def marker_replicas(request: pytest.FixtureRequest) -> int:
    marker = request.node.get_closest_marker("replicas")
    return int(marker.args[0]) if marker else 3


def wait_for_peers(deployment: Deployment) -> None:
    """Until every replica lists the others as peers (in its /readyz), so that all agree on
    each session's owner from the first call."""
    others = len(deployment.replicas) - 1
    for _ in range(1000):
        peers = [
            httpx.get(r.base_url + "/readyz").json()["checks"]["replicas"]["peers"]
            for r in deployment.replicas
        ]
        if all(len(p) == others for p in peers):
            return
    pytest.fail(f"the replicas do not see each other: {peers}")


@dataclass
class Session:
    """One agent session whose calls go to the replicas in turn."""

    name: str
    explicit: bool
    messages: list[dict[str, Any]] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)
    instances: list[str] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def body(self) -> dict[str, Any]:
        if not self.messages:
            self.messages = [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": f"Fix the failing test in {self.name}."},
            ]
        return {"model": MODEL, "messages": self.messages, "max_tokens": 12}

    def answered(self, response: httpx.Response) -> None:
        self.keys.add(response.headers["x-talaria-session-key"])
        self.instances.append(response.headers["x-talaria-instance"])
        self.request_ids.append(response.headers["x-request-id"])
        reply = response.json()["choices"][0]["message"]
        self.messages.append({"role": "assistant", "content": reply.get("content") or ""})
        self.messages.append({"role": "user", "content": f"ran it ({len(self.messages)})"})


def session_owner(session: Session, replicas: list[str]) -> str:
    key = route_key("local", session.name, None)  # loopback callers without a key: "local"
    assert key is not None
    return owner(key, replicas)


def owned_by(replica: str, replicas: list[str], n: int, tag: str) -> list[str]:
    """``n`` explicit session ids that ``replica`` owns among ``replicas``."""
    names: list[str] = []
    while len(names) < n:
        candidate = f"{tag}-{uuid.uuid4().hex[:8]}"
        if session_owner(Session(candidate, explicit=True), replicas) == replica:
            names.append(candidate)
    return names
