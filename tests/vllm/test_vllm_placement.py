"""Placement on the CPU build with real vLLM: a running ``talaria runtime`` process gains a
tiny model's engine when the proxy's placement controller cold-starts it for its first call
(proxy/placement/loop.py), serves it through the proxy, scales it to zero when it has been idle
for its keep-alive (its engine process ends; the model stays listed, ``cold``) and starts it
afresh for its next call; an engine that fails to start is a JSON 500 and leaves the node as it
was (runtime/placement_routes.py)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import httpx
import openai
import pytest

import talaria.runtime
from talaria.core.protocol_calls import request_to_dict
from talaria.core.types import CallRequest
from talaria.proxy.contract.settings import ProxySettings
from tests.integration.server import running_proxy
from tests.support import until
from tests.vllm.runtime_process import running_runtime

pytestmark = pytest.mark.vllm

NODE = """
[node]
name = "cpu-place"
quantum_s = 1.0

[[model]]
name = "tiny-a"
engine = "vllm"
path = "tiny-llama-a"
max_model_len = 2048
"""


LIBRARY = """
[[model]]
name = "tiny-b"
engine = "vllm"
path = "tiny-llama-b"
max_model_len = 2048
"""


def _models_dir(tmp_path: Path) -> Path:
    """The runtime's --models-dir (models placed over HTTP must be in it): tiny-llama-b, and
    ``broken``, tiny-llama-b's directory with an architecture vLLM does not know (its engine
    fails to start)."""
    shipped = Path(talaria.runtime.__file__).parent / "models" / "tiny-llama-b"
    models = tmp_path / "models"
    for name, architecture in (("tiny-llama-b", None), ("broken", "NoSuchForCausalLM")):
        (models / name).mkdir(parents=True)
        config = json.loads((shipped / "config.json").read_text())
        if architecture:
            config["architectures"] = [architecture]
        (models / name / "config.json").write_text(json.dumps(config))
    return models


def _parent(pid: str) -> str | None:
    """The parent's PID of process ``pid`` (/proc/PID/stat, the field after the state), or
    None if it ended."""
    try:
        return (Path("/proc") / pid / "stat").read_text().rpartition(")")[2].split()[1]
    except (OSError, IndexError):
        return None


def _mine(pid: str) -> bool:
    """Whether process ``pid`` descends from this test process (not from another pytest
    worker's runtimes, which start and stop engines of their own meanwhile)."""
    me, seen = str(os.getpid()), 0
    while pid not in ("0", "1") and seen < 64:
        parent = _parent(pid)
        if parent is None:
            return False
        if parent == me:
            return True
        pid, seen = parent, seen + 1
    return False


def _engine_cores() -> int:
    """vLLM EngineCore processes this test started (its runtime's descendants) that run: their
    name, /proc/PID/comm, is cut to 15 characters (``VLLM::EngineCor``); a zombie (state
    ``Z``: ended, its exit status not yet read by its parent, which vLLM's process manager
    leaves after killing it) runs nothing."""
    count = 0
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            running = (proc / "stat").read_text().rpartition(")")[2].split()[0] != "Z"
            if running and "EngineCor" in (proc / "comm").read_text():
                count += _mine(proc.name)
    return count


def test_a_vllm_engine_is_cold_started_on_a_running_node_served_and_removed(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(NODE)
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path}/p.db",
        admin_token="admin-secret-token",
    )
    models_dir = _models_dir(tmp_path)
    with running_runtime(config, args=("--models-dir", str(models_dir))) as runtime:
        models = runtime + "/v1/runtime/models"
        engine_cores = _engine_cores()
        assert engine_cores >= 1  # tiny-a's
        failed = httpx.post(
            models, json={"name": "tiny-x", "engine": "vllm", "path": "broken"}, timeout=600
        )
        assert failed.status_code == 500, failed.text
        assert "NoSuchForCausalLM" in failed.json()["error"]
        assert httpx.get(runtime + "/v1/runtime/status").json()["model_names"] == ["tiny-a"]
        assert _engine_cores() == engine_cores  # nothing of the failed engine left running

        # the proxy's placement controller starts tiny-b's engine for its first call (a
        # cold start over POST /v1/runtime/models), and learns its window from the status;
        # it looks every second and scales a library model to zero after 5 s idle
        library = tmp_path / "library.toml"
        library.write_text(LIBRARY)
        update = {
            "runtimes": [runtime],
            "placement_library": str(library),
            "placement_interval_s": 1.0,
            "placement_keep_alive_s": 5.0,
            "status_ttl_s": 0.0,
        }
        with running_proxy(settings.model_copy(update=update)) as proxy:
            client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0, timeout=600)

            def ask(model: str) -> None:
                reply = client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": "placed " * 20}],
                    max_tokens=8,
                )
                assert reply.model == model and reply.usage.completion_tokens > 0

            def moves() -> list[tuple[str, str, str, str]]:
                admin = httpx.get(
                    proxy.base_url + "/admin/placement",
                    headers={"authorization": "Bearer admin-secret-token"},
                ).json()
                return [(m["kind"], m["model"], m["reason"], m["outcome"]) for m in admin["moves"]]

            def state() -> str:
                return str({m.id: m.model_extra for m in client.models.list()}["tiny-b"]["state"])

            ask("tiny-a")
            ask("tiny-b")
            status = httpx.get(runtime + "/v1/runtime/status").json()
            assert status["model_names"] == ["tiny-a", "tiny-b"]
            assert status["engines"]["tiny-b"]["max_model_len"] == 2048
            started = ("add", "tiny-b", "cold-start", "ok")
            assert moves()[0] == started
            # the placed engine's window (its max_model_len) holds: the proxy refuses a
            # prompt past it with its 400, as for a model hosted from the start
            with pytest.raises(
                openai.BadRequestError,
                match="maximum context length is 2048 tokens; the request has about",
            ):
                client.chat.completions.create(
                    model="tiny-b",
                    messages=[{"role": "user", "content": "placed " * 3000}],
                    max_tokens=8,
                )
            # idle past its keep-alive: evicted, its engine process gone, still listed
            evicted = ("evict", "tiny-b", "scale-to-zero", "ok")
            assert until(lambda: evicted in moves(), seconds=120), moves()
            assert httpx.get(runtime + "/v1/runtime/status").json()["model_names"] == ["tiny-a"]
            assert until(lambda: _engine_cores() == engine_cores, seconds=120)
            assert state() == "cold"
            ask("tiny-a")  # the node serves on
            ask("tiny-b")  # a fresh engine, started for this call
            assert moves()[:3] == [started, evicted, started]
            assert state() == "warm"

        removed = httpx.delete(models + "/tiny-b", timeout=300)
        assert removed.status_code == 200 and removed.json()["model_names"] == ["tiny-a"]
        status = httpx.get(runtime + "/v1/runtime/status").json()
        assert status["model_names"] == ["tiny-a"] and "tiny-b" not in status["engines"]
        call = request_to_dict(CallRequest("r", "s", "tiny-b", 10, 1))
        unknown = httpx.post(runtime + "/v1/runtime/generate", json=call)
        assert unknown.status_code == 404
