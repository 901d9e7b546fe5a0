"""The runtime's placement endpoints over HTTP (runtime/placement_routes.py): a model is added
to a running node and served through the proxy, then removed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import httpx
import openai
import pytest

from talaria.core.protocol_calls import request_to_dict
from talaria.core.types import CallRequest
from talaria.proxy.contract.settings import ProxySettings
from talaria.runtime import placement_routes
from talaria.runtime.config import load_node_config
from talaria.runtime.engine import Engine
from talaria.runtime.engine_kinds import ENGINES, EngineKind, EngineSite
from talaria.runtime.engines.sim import SimEngine
from talaria.runtime.server import create_runtime_app
from tests.integration.server import running_app, running_proxy

NODE_TOML = """
[node]
name = "rt-place"
quantum_s = 30
time_scale = 500

[[model]]
name = "glm-4.5-fp8"
engine = "sim"
"""


def test_a_model_is_added_served_through_the_proxy_and_removed(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(NODE_TOML)
    app = create_runtime_app(load_node_config(path))
    with running_app(app) as runtime:
        models = runtime + "/v1/runtime/models"
        for bad, status in [
            ({"engine": "sim"}, 400),  # no name
            ({"name": "gpt-oss-120b", "engine": "tpu"}, 400),  # no such engine
            ({"name": "not-in-the-catalog", "engine": "sim"}, 400),
            ({"name": "glm-4.5-fp8", "engine": "sim"}, 409),  # hosted already
            ({"name": "mine", "engine": "vllm", "path": str(tmp_path / "absent")}, 400),
        ]:
            answer = httpx.post(models, json=bad)
            assert answer.status_code == status, (bad, answer.text)
            assert "error" in answer.json()
        assert httpx.post(models, content=b"{not json").status_code == 400

        settings = ProxySettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path}/p.db",
            admin_token="admin-secret-token",
            runtimes=[runtime],
        )
        with running_proxy(settings) as proxy:
            client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
            with pytest.raises(openai.NotFoundError, match="gpt-oss-120b"):
                client.chat.completions.create(
                    model="gpt-oss-120b", messages=[{"role": "user", "content": "not yet"}]
                )
            added = httpx.post(models, json={"name": "gpt-oss-120b", "engine": "sim"})
            assert added.status_code == 201, added.text
            assert added.json()["model_names"] == ["glm-4.5-fp8", "gpt-oss-120b"]
            status = httpx.get(runtime + "/v1/runtime/status").json()
            assert status["model_names"] == ["glm-4.5-fp8", "gpt-oss-120b"]
            assert set(status["models"]) == {"glm-4.5-fp8", "gpt-oss-120b"}
            # the proxy has not read the runtime's status since: the first call finds it
            reply = client.chat.completions.create(
                model="gpt-oss-120b", messages=[{"role": "user", "content": "placed"}]
            )
            assert reply.model == "gpt-oss-120b" and reply.usage.completion_tokens > 0
            assert sorted(m.id for m in client.models.list()) == ["glm-4.5-fp8", "gpt-oss-120b"]

            removed = httpx.delete(models + "/gpt-oss-120b")
            assert removed.status_code == 200 and removed.json()["model_names"] == ["glm-4.5-fp8"]
            assert sorted(m.id for m in client.models.list()) == ["glm-4.5-fp8"]
            with pytest.raises(openai.NotFoundError, match="gpt-oss-120b"):
                client.chat.completions.create(
                    model="gpt-oss-120b", messages=[{"role": "user", "content": "gone"}]
                )
        assert httpx.delete(models + "/gpt-oss-120b").status_code == 404
        last = httpx.delete(models + "/glm-4.5-fp8")
        assert last.status_code == 409 and "last model" in last.json()["error"]


class _FailsToStart(SimEngine):
    """A simulated engine whose start fails after it has taken something (a child process,
    for vLLM): ``shut_down`` tells whether the node released it."""

    shut_down: ClassVar[list[str]] = []

    async def start(self) -> None:
        raise RuntimeError("engine core died during startup")

    async def shutdown(self) -> None:
        self.shut_down.append(self.model)


def test_an_engine_that_fails_to_start_is_a_json_500_and_leaves_the_node_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def build(site: EngineSite) -> Engine:
        engine = ENGINES["sim"].build(site)
        engine.__class__ = _FailsToStart
        return engine

    _FailsToStart.shut_down.clear()
    monkeypatch.setitem(ENGINES, "flaky", EngineKind(build, uses_node_memory=True))
    path = tmp_path / "node.toml"
    path.write_text(NODE_TOML)
    app = create_runtime_app(load_node_config(path))
    with running_app(app) as runtime:
        memory = app.state.runtime.built.node.memory
        host_kv_bytes = memory.host_kv_capacity_bytes
        models = runtime + "/v1/runtime/models"
        failed = httpx.post(models, json={"name": "gpt-oss-120b", "engine": "flaky"})
        assert failed.status_code == 500 and failed.headers["content-type"] == "application/json"
        assert "engine core died during startup" in failed.json()["error"]
        assert _FailsToStart.shut_down == ["gpt-oss-120b"]
        after = httpx.get(runtime + "/v1/runtime/status").json()
        assert after["model_names"] == ["glm-4.5-fp8"] and set(after["models"]) == {"glm-4.5-fp8"}
        assert memory.host_kv_capacity_bytes == host_kv_bytes  # no weight copy pinned
        # the node still takes the model once an engine starts
        added = httpx.post(models, json={"name": "gpt-oss-120b", "engine": "sim"})
        assert added.status_code == 201, added.text


def test_a_model_being_removed_is_unlisted_first_and_still_serves_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(placement_routes, "LEAVE_GRACE_S", 5.0)
    path = tmp_path / "node.toml"
    path.write_text(NODE_TOML + '\n[[model]]\nname = "gpt-oss-120b"\nengine = "sim"\n')
    app = create_runtime_app(load_node_config(path))
    with running_app(app) as runtime, ThreadPoolExecutor(1) as pool:
        removal = pool.submit(httpx.delete, runtime + "/v1/runtime/models/gpt-oss-120b",
                              timeout=120)  # fmt: skip
        while "gpt-oss-120b" in httpx.get(runtime + "/v1/runtime/status").json()["model_names"]:
            assert not removal.done(), removal.result().text
        # a proxy that routed a call before it read that status: the call is served
        call = request_to_dict(CallRequest("r1", "s1", "gpt-oss-120b", 10, 1))
        served = httpx.post(runtime + "/v1/runtime/generate", json=call, timeout=120)
        assert served.status_code == 200 and '"finished"' in served.text
        assert not removal.done()  # still within the grace
        assert removal.result().status_code == 200


def test_the_runtime_meters_demand_over_the_window_a_controller_asks_for(
    tmp_path: Path,
) -> None:
    path = tmp_path / "node.toml"
    path.write_text(NODE_TOML)
    with running_app(create_runtime_app(load_node_config(path))) as runtime:
        for i, session in enumerate(["s1", "s1", "s2"]):
            call = request_to_dict(CallRequest(f"r{i}", session, "glm-4.5-fp8", 100, 8))
            served = httpx.post(runtime + "/v1/runtime/generate", json=call, timeout=120)
            assert served.status_code == 200 and '"finished"' in served.text
        doc = httpx.get(runtime + "/v1/runtime/demand", params={"window_s": 300}).json()
        assert doc["demand"] == {"glm-4.5-fp8": 2.0}  # distinct sessions
        assert doc["finished_calls"] == {"glm-4.5-fp8": 3}
        assert doc["call_s"]["glm-4.5-fp8"] > 0
        for bad in (0, -1, 3601):
            refused = httpx.get(runtime + "/v1/runtime/demand", params={"window_s": bad})
            assert refused.status_code == 400 and "window_s" in refused.json()["error"]
