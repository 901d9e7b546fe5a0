"""The servers and balancers of bench/replicas_live.py: a replica (``llama-server`` or ``vllm
serve`` of SmolLM2-135M-Instruct) and how it counts the prompt tokens it computed, nginx round
robin in front of replicas, HAProxy's sticky sessions with a lifetime in front of them, and
LiteLLM's proxy router in front of them."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.harness.nginx import nginx_binary
from bench.harness.processes import ROOT, free_port, stopped

SERVED = "smollm2"
"""The name both replicas serve the model under."""
LITELLM_KEY = "sk-replicas-bench-0123456789abcdef0123456789abcdef"
"""LiteLLM's proxy refuses to start without a master key; every call of the bench sends it
(the other fronts ignore it)."""


@dataclass
class Replica:
    """One server process, its root URL, and how it counts computed prompt tokens."""

    process: subprocess.Popen[bytes]
    root: str
    computed_of: Callable[[dict[str, float]], float]

    def metrics(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for line in httpx.get(self.root + "/metrics", timeout=30).text.splitlines():
            if line and not line.startswith("#"):
                head, _, value = line.rpartition(" ")
                name = head.split("{")[0]
                values[name] = values.get(name, 0.0) + float(value)
        return values

    def computed(self) -> float:
        """Prompt tokens it computed so far (not found in its cache)."""
        return self.computed_of(self.metrics())


def _llama_computed(m: dict[str, float]) -> float:
    return m["llamacpp:prompt_tokens_total"]


def _vllm_computed(m: dict[str, float]) -> float:
    return m["vllm:prefix_cache_queries_total"] - m["vllm:prefix_cache_hits_total"]


@contextlib.contextmanager
def replica(
    kind: str,
    source: Path,
    binary: str,
    core: int,
    window: int,
    log: Path,
    kv_cache_mib: int | None = None,
) -> Iterator[Replica]:
    """A server of ``source`` on a free port (a ``window`` of tokens per sequence), until it
    lists the model; a vLLM model directory without weights gets random ones. vLLM's KV
    cache is ``kv_cache_mib`` MiB (``--kv-cache-memory-bytes``), else 1 GiB
    (``VLLM_CPU_KVCACHE_SPACE``, which takes whole GiB only)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALARIA_")}
    if kind == "llama":
        command = [binary, "-m", str(source), "--alias", SERVED, "--host", "127.0.0.1",
                   "--port", str(port), "-c", str(2 * window), "-np", "2", "--metrics",
                   "-t", "1"]  # fmt: skip
        computed, startup_s = _llama_computed, 120.0
    else:
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                   "--model", str(source), "--served-model-name", SERVED, "--host", "127.0.0.1",
                   "--port", str(port), "--max-model-len", str(window),
                   "--enforce-eager"]  # fmt: skip
        if not any(source.glob("*.safetensors")) and not any(source.glob("*.bin")):
            command += ["--load-format", "dummy"]  # a tiny test model: random weights
        env |= {"VLLM_CPU_OMP_THREADS_BIND": str(core), "HF_HUB_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}  # fmt: skip
        if kv_cache_mib is None:
            env["VLLM_CPU_KVCACHE_SPACE"] = "1"
        else:  # the variable, when set, overrides the flag (vllm/platforms/cpu.py)
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)
            command += ["--kv-cache-memory-bytes", str(kv_cache_mib * 2**20)]
        computed, startup_s = _vllm_computed, 600.0
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Replica(process, f"http://127.0.0.1:{port}", computed)

    def listed() -> bool:
        models = httpx.get(server.root + "/v1/models", timeout=5).json()["data"]
        return any(m["id"] == SERVED for m in models)

    with _waited(process, listed, log, startup_s):
        yield server


@contextlib.contextmanager
def _waited(
    process: subprocess.Popen[bytes], ready: Callable[[], bool], log: Path, startup_s: float
) -> Iterator[None]:
    """Until ``ready()`` (an HTTP error or a malformed answer: not yet), at most ``startup_s``;
    the process stopped at the end (killed if SIGTERM does not end it within 60 s)."""
    try:
        deadline = time.monotonic() + startup_s
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                if ready():
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"{process.args!r} did not start: {tail}")
            threading.Event().wait(0.3)
        yield
    finally:
        stopped(process, 60)


def _answers(url: str) -> Callable[[], bool]:
    """Ready once ``url`` answers at all (any status)."""
    return lambda: httpx.get(url, timeout=2).status_code > 0


@contextlib.contextmanager
def round_robin(hosts: list[str], folder: Path) -> Iterator[str]:
    """nginx balancing ``hosts`` (``host:port``) round robin; its base URL."""
    binary = nginx_binary()
    if binary is None:
        raise RuntimeError("no nginx: bash scripts/apt-provide.sh nginx-light nginx")
    port = free_port()
    servers = "".join(f"    server {h};\n" for h in hosts)
    conf = folder / "nginx.conf"
    conf.write_text(
        f"daemon off;\nuser root;\nworker_processes 1;\npid {folder}/nginx.pid;\n"
        f"error_log {folder}/error.log warn;\nevents {{ worker_connections 512; }}\n"
        f"http {{\n  access_log off;\n  client_body_temp_path {folder}/body;\n"
        f"  proxy_temp_path {folder}/proxy;\n  upstream replicas {{\n{servers}  }}\n"
        f"  server {{\n    listen 127.0.0.1:{port};\n    location / {{\n"
        "      proxy_pass http://replicas;\n      proxy_http_version 1.1;\n"
        '      proxy_set_header Connection "";\n      proxy_buffering off;\n'
        "      proxy_read_timeout 600s;\n"
        "      add_header X-Upstream $upstream_addr always;\n    }\n  }\n}\n"
    )
    process = subprocess.Popen([binary, "-c", str(conf)], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    with _waited(process, _answers(url + "/"), folder / "error.log", 180):
        yield url


@contextlib.contextmanager
def sticky(hosts: list[str], folder: Path, lifetime_s: float, key: str) -> Iterator[str]:
    """HAProxy sticky sessions in front of ``hosts`` (``host:port``); its base URL. A session
    (header ``key``) goes to the replica it went to last, unless it has been idle for
    ``lifetime_s`` or more: its stick-table entry expires (an entry lives ``expire`` since it
    was last created or matched, HAProxy 2.6's ``stick-table`` documentation) and the call is
    balanced round robin like a new session. ``X-Upstream`` names the replica."""
    binary = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
    if binary is None:
        raise RuntimeError("no haproxy: bash scripts/apt-provide.sh haproxy haproxy")
    port = free_port()
    servers = "".join(f"  server r{i} {h}\n" for i, h in enumerate(hosts))
    conf = folder / "haproxy.cfg"
    conf.write_text(
        "global\n  maxconn 1024\ndefaults\n  mode http\n  timeout connect 5s\n"
        "  timeout client 600s\n  timeout server 600s\n"
        f"frontend bench\n  bind 127.0.0.1:{port}\n  default_backend replicas\n"
        "backend replicas\n  balance roundrobin\n"
        f"  stick-table type string len 128 size 100k expire {max(1, round(lifetime_s * 1000))}ms\n"
        f"  stick on req.hdr({key})\n"
        "  http-response set-header X-Upstream %[srv_name]\n" + servers
    )
    process = subprocess.Popen([binary, "-db", "-f", str(conf)], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    with _waited(process, _answers(url + "/v1/models"), conf, 60):
        yield url


def litellm_binary() -> str:
    """LiteLLM's proxy: out/litellm-venv's (docs/proxy-overhead.md installs it there), else
    .venv's if it has the ``proxy`` extra, else ``litellm`` on the PATH."""
    for venv in (ROOT / "out/litellm-venv", ROOT / ".venv"):
        python, litellm = venv / "bin" / "python", venv / "bin" / "litellm"
        probe = [str(python), "-c", "import orjson, fastapi"]
        if litellm.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
            return str(litellm)
    found = shutil.which("litellm")
    if found is None:
        raise RuntimeError("no litellm: pip install 'litellm[proxy]' (docs/proxy-overhead.md)")
    return found


@contextlib.contextmanager
def litellm_router(roots: list[str], folder: Path) -> Iterator[str]:
    """LiteLLM's proxy with the replicas as deployments of ``SERVED``; its base URL."""
    port = free_port()
    deployments = "".join(
        f"  - model_name: {SERVED}\n    litellm_params:\n      model: openai/{SERVED}\n"
        f"      api_base: {root}/v1\n      api_key: none\n"
        for root in roots
    )
    config = folder / "litellm.yaml"
    config.write_text(f"model_list:\n{deployments}general_settings:\n  master_key: {LITELLM_KEY}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALARIA_")}
    env |= {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "WARNING"}
    command = [litellm_binary(), "--config", str(config), "--host", "127.0.0.1",
               "--port", str(port), "--num_workers", "1"]  # fmt: skip
    with (folder / "litellm.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    with _waited(process, _answers(url + "/health/liveliness"), folder / "litellm.log", 180):
        yield url
