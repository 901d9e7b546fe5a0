"""LiteLLM's proxy as ``bench/proxy_overhead.py``'s fourth server: which executable, its
facts (version, loop, HTTP parser), and its start with a config forwarding ``bench-model`` to
the direct server."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from overhead.apis import MODEL
from overhead.procs import HOST, ROOT, Server, clean_env, free_port, start_server

MASTER_KEY = "sk-bench-overhead"
"""LiteLLM's proxy asks every request for it; every request of the bench carries it."""


def litellm_candidates(explicit: str | None) -> list[str]:
    """The litellm executables to try, in order: ``--litellm``, else .venv/bin,
    out/litellm-venv/bin, PATH (a plain ``litellm`` without its proxy extra fails to start;
    the next one is tried)."""
    if explicit:
        return [explicit]
    found = [
        str(c)
        for c in (ROOT / ".venv/bin/litellm", ROOT / "out/litellm-venv/bin/litellm")
        if c.exists()
    ]
    on_path = shutil.which("litellm")
    if on_path and on_path not in found:
        found.append(on_path)
    return found


def litellm_facts(executable: str) -> dict[str, Any]:
    """LiteLLM's version and event loop / HTTP parser, asked of its own interpreter."""
    python = Path(executable).with_name("python")
    code = (
        "import importlib.metadata as m, importlib.util as u, json;"
        "print(json.dumps({'version': m.version('litellm'),"
        "'uvicorn': m.version('uvicorn'), 'fastapi': m.version('fastapi'),"
        "'httptools': u.find_spec('httptools') is not None,"
        "'uvloop': u.find_spec('uvloop') is not None}))"
    )
    try:
        out = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
        facts: dict[str, Any] = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError) as exc:
        return {"error": repr(exc)}
    facts["loop"] = "uvloop (litellm's CLI forces it)" if facts.get("uvloop") else "asyncio"
    facts["http"] = "httptools" if facts.pop("httptools") else "h11"
    return facts


def start_litellm(executable: str, direct_port: int, workdir: Path, access_log: bool) -> Server:
    port = free_port()
    config = workdir / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: http://{HOST}:{direct_port}/v1\n"
        "      api_key: x\n"
        "general_settings:\n"
        f"  master_key: {MASTER_KEY}\n"
    )
    env = clean_env()
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    if not access_log:
        env["LITELLM_LOG"] = "WARNING"  # uvicorn at "warning": no access log, like the others
    cmd = [
        executable,
        "--config",
        str(config),
        "--host",
        HOST,
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    return start_server("litellm", cmd, port, workdir, env)
