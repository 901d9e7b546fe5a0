"""The chaos scenario's processes: two ``talaria runtime`` nodes and three ``talaria serve``
replicas (bench/harness/chaos/__init__.py says how they are set up), and what a fault does to
them: kill -9 a replica, restart it on its port, stop or continue a runtime."""

from __future__ import annotations

import os
import signal
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench.harness.chaos.config import (
    ADMIN_TOKEN,
    CLUSTER_SECRET,
    MODEL,
    RUNTIME_TOKEN,
    ChaosConfig,
)
from bench.harness.nginx import Nginx
from bench.harness.processes import (
    ServeProcess,
    descendant_pids,
    free_port,
    talaria_runtime,
    talaria_serve,
)

NODE_TOML = """
[node]
name = "{name}"
policy = "talaria"
time_scale = {scale}

[[model]]
name = "{model}"
engine = "sim"
"""

RENUMBERED = "was taken (two replicas served it at once)"
"""What the store logs when it renumbers a call (proxy/store/call_numbers.py)."""


class Cluster:
    """The processes (module docstring), started into ``stack``; PostgreSQL is the caller's."""

    def __init__(
        self, config: ChaosConfig, database_url: str, folder: Path, stack: ExitStack
    ) -> None:
        self.config, self.folder, self.stack = config, folder, stack
        self.runtimes: dict[str, ServeProcess] = {}
        for i in range(config.runtimes):
            name = f"node-{chr(ord('a') + i)}"
            toml = folder / f"{name}.toml"
            toml.write_text(NODE_TOML.format(name=name, scale=config.time_scale, model=MODEL))
            env = {"TALARIA_RUNTIME_TOKEN": RUNTIME_TOKEN}
            self.runtimes[name] = stack.enter_context(talaria_runtime(toml, env=env))
        self.args = ["--database-url", database_url, "--time-scale", str(config.time_scale)]
        for runtime in self.runtimes.values():
            self.args += ["--runtime", runtime.base_url]
        self.ports = [free_port() for _ in range(config.replicas)]
        self.replicas: list[ServeProcess] = []
        self.retired: list[ServeProcess] = []
        """Replicas killed (their logs are kept)."""
        for i in range(config.replicas):
            self.replicas.append(self._start(i))
        self.wait_for_peers()

    def _env(self, i: int) -> dict[str, str]:
        return {
            "TALARIA_REPLICA_URL": f"http://127.0.0.1:{self.ports[i]}",
            "TALARIA_REPLICA_AFFINITY": "ingress",
            "TALARIA_CLUSTER_SECRET": CLUSTER_SECRET,
            "TALARIA_ADMIN_TOKEN": ADMIN_TOKEN,
            "TALARIA_RUNTIME_TOKEN": RUNTIME_TOKEN,
            **self.config.replica_env,
        }

    def _start(self, i: int) -> ServeProcess:
        data = self.folder / f"replica{i}"
        data.mkdir(exist_ok=True)
        served = talaria_serve(self.args, self._env(i), data, port=self.ports[i])
        return self.stack.enter_context(served)

    @property
    def upstreams(self) -> list[str]:
        """The replicas as nginx lists them (``127.0.0.1:PORT``)."""
        return [f"127.0.0.1:{p}" for p in self.ports]

    def kill(self, i: int) -> None:
        """kill -9 replica ``i``."""
        self.replicas[i].kill9()
        self.retired.append(self.replicas[i])

    def restart(self, i: int) -> None:
        """Start replica ``i`` again on its port; returns once it listens."""
        self.replicas[i] = self._start(i)

    def wait_for_peers(self, timeout_s: float = 60.0) -> None:
        """Until every replica lists the others in its /readyz (bounded)."""
        deadline = time.monotonic() + timeout_s
        others = len(self.replicas) - 1
        while True:
            seen = []
            for replica in self.replicas:
                try:
                    checks = httpx.get(replica.base_url + "/readyz", timeout=5).json()["checks"]
                    seen.append(len(checks.get("replicas", {}).get("peers", ())))
                except (httpx.HTTPError, ValueError, KeyError):
                    seen.append(-1)
            if all(n == others for n in seen):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the replicas do not see each other: {seen}")
            time.sleep(0.1)  # polling a process's readiness (bounded by the deadline)

    def stop_runtime(self, name: str, sig: signal.Signals) -> None:
        """Send ``sig`` to runtime ``name`` and every process under it."""
        pid = self.runtimes[name].process.pid
        for each in [pid, *descendant_pids(pid)]:
            os.kill(each, sig)

    def write_logs(self, folder: Path, nginx: Nginx) -> None:
        """Every process's output, one file each."""
        folder.mkdir(exist_ok=True)
        for name, runtime in self.runtimes.items():
            (folder / f"runtime-{name}.log").write_text("".join(runtime.output))
        for n, replica in enumerate(self.retired):
            (folder / f"replica-killed-{n}.log").write_text("".join(replica.output))
        for i, replica in enumerate(self.replicas):
            (folder / f"replica-{i}.log").write_text("".join(replica.output))
        (folder / "nginx-error.log").write_text(nginx.error_log())

    def renumbered(self) -> int:
        """How many times the store renumbered a call, by the replicas' logs."""
        return sum(
            line.count(RENUMBERED) for r in [*self.replicas, *self.retired] for line in r.output
        )
