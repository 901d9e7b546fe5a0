"""The deployment of bench/cluster_live.py, every part a real process on loopback: a
throwaway PostgreSQL, one ``talaria runtime`` per node of the layout, R ``talaria serve``
replicas on both, ready once every replica lists the others; and their logs."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.harness.processes import (
    Postgres,
    ServeProcess,
    free_port,
    talaria_runtime,
    talaria_serve,
)
from talaria.sim.experiment import ExperimentSetup

ADMIN = "cluster-bench-admin"
READY_TIMEOUT_S = 60.0


def log(message: str) -> None:
    print(f"[cluster-live {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def node_toml(name: str, models: tuple[str, ...], setup: ExperimentSetup, scale: float) -> str:
    blocks = "".join(f'\n[[model]]\nname = "{m}"\nengine = "sim"\n' for m in models)
    return (
        f'[node]\nname = "{name}"\npolicy = "talaria"\nquantum_s = {setup.quantum_s}\n'
        f'time_scale = {scale}\nserver = "{setup.server}"\nprofile = "{setup.profile}"\n{blocks}'
    )


@dataclass
class Deployment:
    replicas: list[ServeProcess]
    runtimes: list[ServeProcess]
    pg_dir: Path
    database_url: str
    urls: list[str] = field(default_factory=list)


def start(
    stack: ExitStack,
    work: Path,
    setup: ExperimentSetup,
    replicas: int,
    scale: float,
    affinity: str = "rendezvous",
) -> Deployment:
    """PostgreSQL, one runtime per node, ``replicas`` proxies (``TALARIA_REPLICA_AFFINITY``
    ``affinity``); every one stopped by ``stack``."""
    # a folder of its own: PostgreSQL runs as user postgres, who cannot enter ``work`` (0700)
    pg_dir = Path(tempfile.mkdtemp(prefix="talaria-cluster-pg-"))
    stack.callback(shutil.rmtree, pg_dir, ignore_errors=True)
    pg = Postgres(pg_dir, free_port())
    log(f"starting PostgreSQL in {pg_dir}")
    stack.callback(pg.stop)  # before start: a half-started server is stopped too
    try:
        url = pg.start()
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"PostgreSQL did not start: {exc.stderr}") from exc
    runtimes = []
    for name, node in setup.layout():
        config = work / f"{name}.toml"
        config.write_text(node_toml(name, node.models, setup, scale))
        log(f"starting runtime {name}: {', '.join(node.models)} (time ×{scale:g})")
        runtimes.append(stack.enter_context(talaria_runtime(config)))
    args = ["--database-url", url, "--time-scale", str(scale)]
    for runtime in runtimes:
        args += ["--runtime", runtime.base_url]
    proxies = []
    secret = secrets.token_urlsafe(32)  # the replicas sign their forwards with it
    for i in range(replicas):
        port = free_port()
        env = {
            "TALARIA_REPLICA_URL": f"http://127.0.0.1:{port}",
            "TALARIA_ADMIN_TOKEN": ADMIN,
            "TALARIA_CLUSTER_SECRET": secret,
            "TALARIA_REPLICA_AFFINITY": affinity,
        }
        data = work / f"replica{i}"
        data.mkdir()
        log(f"starting proxy replica {i + 1}/{replicas} on port {port}")
        proxies.append(stack.enter_context(talaria_serve(args, env, data, port=port)))
    deployment = Deployment(proxies, runtimes, pg_dir, url, [p.base_url for p in proxies])
    wait_ready(deployment)
    return deployment


def wait_ready(deployment: Deployment) -> None:
    """Until every replica is ready (store, runtimes) and lists all the others as peers."""
    others = len(deployment.urls) - 1
    deadline = time.monotonic() + READY_TIMEOUT_S
    seen: list[Any] = []
    with httpx.Client(timeout=10) as client:
        while time.monotonic() < deadline:
            seen = [client.get(u + "/readyz").json() for u in deployment.urls]
            if all(
                doc["ready"] and len(doc["checks"]["replicas"]["peers"]) == others for doc in seen
            ):
                log(f"{len(seen)} replica(s) ready, each listing its {others} peer(s)")
                return
            time.sleep(0.05)  # polling the replicas' own view, bounded by the deadline
    raise RuntimeError(f"replicas not ready within {READY_TIMEOUT_S:g} s: {seen}")


def postmaster_pid(pg_dir: Path) -> int | None:
    try:
        return int((pg_dir / "data" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def save_logs(folder: Path, deployment: Deployment) -> None:
    """Every process's log so far (stderr), one file each."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, proxy in enumerate(deployment.replicas):
        (folder / f"replica{i}.log").write_text("".join(proxy.output))
    for i, runtime in enumerate(deployment.runtimes):
        (folder / f"node{i}.log").write_text("".join(runtime.output))
    log(f"logs in {folder}")


def show_errors(deployment: Deployment, lines: int = 60) -> None:
    """The first error a replica logged (calls failed: what the proxy said)."""
    for i, proxy in enumerate(deployment.replicas):
        for n, line in enumerate(proxy.output):
            if "Traceback" in line or " ERROR" in line or line.startswith("ERROR"):
                log(f"replica {i}'s first error:\n" + "".join(proxy.output[n : n + lines]))
                return
    log("calls failed, but no replica logged an error")
