"""nginx in front of proxy replicas, as deploy/nginx/talaria.conf ships it: only its replica
list and its listen port filled in (tests/e2e/test_ingress_affinity.py, tests/e2e/test_chaos.py,
bench/chaos.py). Every answer carries ``X-Upstream``, the replica nginx chose."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.harness.processes import ROOT, free_port

CONF = ROOT / "deploy" / "nginx" / "talaria.conf"


def nginx_binary() -> str | None:
    """``TALARIA_NGINX`` (scripts/test.sh sets it), else ``nginx`` on the PATH or in
    /usr/sbin; None when there is none (bash scripts/apt-provide.sh nginx-light nginx)."""
    return (
        os.environ.get("TALARIA_NGINX")
        or shutil.which("nginx")
        or shutil.which("nginx", path="/usr/sbin")
    )


def accepts(port: int) -> bool:
    """Something accepts TCP connections on 127.0.0.1:``port`` now."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Nginx:
    """nginx running deploy/nginx/talaria.conf with ``upstreams`` and on ``port``; X-Upstream
    on every answer names the replica that nginx chose."""

    def __init__(self, binary: str, folder: Path) -> None:
        self.binary, self.folder = binary, folder
        folder.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.main = folder / "nginx.conf"
        self.main.write_text(
            f"daemon off;\nuser root;\nworker_processes 1;\npid {folder}/nginx.pid;\n"
            f"error_log {folder}/error.log warn;\nevents {{ worker_connections 512; }}\n"
            f"http {{\n  access_log off;\n  client_body_temp_path {folder}/body;\n"
            f"  proxy_temp_path {folder}/proxy;\n"
            "  add_header X-Upstream $upstream_addr always;\n"
            f"  include {folder}/talaria.conf;\n}}\n"
        )

    def configure(self, upstreams: list[str]) -> None:
        """Write talaria.conf with these replicas (``host:port``) and check it (nginx -t)."""
        text = CONF.read_text()
        servers = re.findall(r"^\s*server talaria-proxy-\d+:8000([^;]*);\n", text, re.M)
        assert servers, "deploy/nginx/talaria.conf lists no replica"
        text = re.sub(r"^\s*server talaria-proxy-\d+:8000[^;]*;\n", "", text, flags=re.M)
        lines = "".join(f"    server {u}{servers[0]};\n" for u in upstreams)
        text = text.replace("    keepalive", lines + "    keepalive", 1)
        text = text.replace("listen 8080;", f"listen 127.0.0.1:{self.port};")
        (self.folder / "talaria.conf").write_text(text)
        self._run("-t")

    def _run(self, *args: str) -> None:
        done = subprocess.run(
            [self.binary, "-c", str(self.main), "-p", str(self.folder), *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr

    def reload(self, upstreams: list[str]) -> None:
        """The replicas become ``upstreams`` (nginx -s reload; new workers take them)."""
        self.configure(upstreams)
        self._run("-s", "reload")

    def error_log(self) -> str:
        """What nginx logged (warnings and worse)."""
        path = self.folder / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    @contextmanager
    def running(self) -> Iterator[Nginx]:
        """nginx in the foreground until the block ends (terminated then)."""
        process = subprocess.Popen(
            [self.binary, "-c", str(self.main), "-p", str(self.folder)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            while not accepts(self.port):
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
            yield self
        finally:
            process.terminate()
            process.wait(timeout=30)
