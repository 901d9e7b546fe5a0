"""Placement on the CPU build with real vLLM: a running ``talaria runtime`` process gains a
tiny model's engine over HTTP, serves it through the proxy, and lets it go
(runtime/placement_routes.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from talaria.core.protocol import request_to_dict
from talaria.core.types import CallRequest
from talaria.proxy.settings import ProxySettings
from tests.integration.server import running_proxy
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


def test_a_vllm_engine_is_added_to_a_running_node_served_and_removed(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(NODE)
    with running_runtime(config) as runtime:
        models = runtime + "/v1/runtime/models"
        entry = {"name": "tiny-b", "engine": "vllm", "path": "tiny-llama-b", "max_model_len": 2048}
        added = httpx.post(models, json=entry, timeout=600)  # the engine starts (~20 s)
        assert added.status_code == 201, added.text
        assert added.json()["model_names"] == ["tiny-a", "tiny-b"]
        status = httpx.get(runtime + "/v1/runtime/status").json()
        assert status["engines"]["tiny-b"]["max_model_len"] == 2048

        settings = ProxySettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path}/p.db",
            admin_token="admin-secret-token",
            runtimes=[runtime],
        )
        with running_proxy(settings) as proxy:
            client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0, timeout=300)
            for model in ("tiny-b", "tiny-a"):
                reply = client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": "placed " * 20}],
                    max_tokens=8,
                )
                assert reply.model == model and reply.usage.completion_tokens > 0

        removed = httpx.delete(models + "/tiny-b", timeout=300)
        assert removed.status_code == 200 and removed.json()["model_names"] == ["tiny-a"]
        status = httpx.get(runtime + "/v1/runtime/status").json()
        assert status["model_names"] == ["tiny-a"] and "tiny-b" not in status["engines"]
        call = request_to_dict(CallRequest("r", "s", "tiny-b", 10, 1))
        unknown = httpx.post(runtime + "/v1/runtime/generate", json=call)
        assert unknown.status_code == 404
