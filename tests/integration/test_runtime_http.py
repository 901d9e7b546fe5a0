"""The runtime server over HTTP: proxy → HttpRuntime → runtime server (simulated engines), and
a runtime process that drains on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from bench.harness.processes import free_port
from talaria.core.protocol_calls import request_to_dict
from talaria.core.status import InstanceStatus
from talaria.core.types import CallRequest, Finished, GenerationEvent
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.runtimes.http import HttpRuntime
from talaria.runtime.config import load_node_config
from talaria.runtime.server import create_runtime_app
from tests.integration.server import running_app, running_proxy

NODE_TOML = """
[node]
name = "{name}"
policy = "talaria"
quantum_s = 30
time_scale = {scale}

[[model]]
name = "glm-4.5-fp8"
engine = "sim"

[[model]]
name = "gpt-oss-120b"
engine = "sim"
"""


def _node_file(tmp: Path, name: str, scale: float) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(NODE_TOML.format(name=name, scale=scale))
    return path


@pytest.fixture(scope="module")
def runtime_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("rt")
    app = create_runtime_app(load_node_config(_node_file(tmp, "rt-a", 500)))
    with running_app(app) as url:
        yield url


def test_runtime_status_and_generate_stream(runtime_url: str) -> None:
    status = httpx.get(runtime_url + "/v1/runtime/status").json()
    assert status["instance"] == "rt-a"
    assert status["model_names"] == ["glm-4.5-fp8", "gpt-oss-120b"]
    request = CallRequest("r1", "s1", "glm-4.5-fp8", 800, 24, stream=True)
    with httpx.stream(
        "POST", runtime_url + "/v1/runtime/generate", json=request_to_dict(request)
    ) as response:
        events = [json.loads(line) for line in response.iter_lines() if line]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "first" and kinds[-1] == "finished" and "delta" in kinds
    assert events[-1]["result"]["output_tokens"] == 24
    bad = httpx.post(runtime_url + "/v1/runtime/generate", json={"model": "x"})
    assert bad.status_code == 400
    unknown = httpx.post(
        runtime_url + "/v1/runtime/generate",
        json=request_to_dict(CallRequest("r2", "s2", "nope", 10, 1)),
    )
    assert unknown.status_code == 404


def test_proxy_over_http_runtime(runtime_url: str, tmp_path: Path) -> None:
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path}/p.db",
        admin_token="admin-secret-token",
        runtimes=[runtime_url],
    )
    with running_proxy(settings) as proxy:
        client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
        assert sorted(m.id for m in client.models.list()) == ["glm-4.5-fp8", "gpt-oss-120b"]
        messages = [{"role": "user", "content": "over http " * 100}]
        first = client.chat.completions.create(
            model="glm-4.5-fp8", messages=messages, extra_headers={"x-session-id": "h1"}
        )
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "next"},
        ]
        chunks = list(
            client.chat.completions.create(
                model="glm-4.5-fp8",
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
                extra_headers={"x-session-id": "h1"},
            )
        )
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0
        instances = httpx.get(
            proxy.base_url + "/admin/instances",
            headers={"Authorization": "Bearer admin-secret-token"},
        ).json()["data"]
        assert instances[0]["name"] == "rt-a" and instances[0]["kind"] == "http"


def test_slot_wait_and_the_nodes_slots_cross_the_wire(tmp_path: Path) -> None:
    """A fresh node wakes its model for the first call: the call's result (NDJSON) carries
    that wait, and the status document the slot it opened."""
    app = create_runtime_app(load_node_config(_node_file(tmp_path, "rt-d", 500)))

    async def call_then_status(url: str) -> tuple[list[GenerationEvent], InstanceStatus]:
        runtime = HttpRuntime(url, status_ttl_s=0)
        await runtime.start()
        try:
            request = CallRequest("r1", "s1", "glm-4.5-fp8", 800, 8)
            events = [event async for event in runtime.generate(request)]
            return events, await runtime.status()
        finally:
            await runtime.close()

    with running_app(app) as url:
        events, status = asyncio.run(call_then_status(url))
    finished = events[-1]
    assert isinstance(finished, Finished)
    result = finished.result
    (slot,) = status.recent_slots
    assert (slot.model, slot.end_s, slot.close, slot.admitted) == ("glm-4.5-fp8", None, None, 1)
    assert 0 < slot.switch_s <= result.slot_wait_s <= result.queue_s
    assert {m: r.waiting_calls for m, r in status.models.items()} == {
        "glm-4.5-fp8": 0,
        "gpt-oss-120b": 0,
    }


def test_proxy_answers_503_when_the_runtime_is_gone(tmp_path: Path) -> None:
    app = create_runtime_app(load_node_config(_node_file(tmp_path, "rt-b", 500)))
    settings_path = f"sqlite+aiosqlite:///{tmp_path}/p2.db"
    with running_app(app) as url:
        settings = ProxySettings(database_url=settings_path, runtimes=[url], status_ttl_s=0)
        with running_proxy(settings) as proxy:
            client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
            assert client.chat.completions.create(
                model="gpt-oss-120b", messages=[{"role": "user", "content": "x"}]
            ).choices
            # the runtime starts refusing calls while the proxy keeps running
            stopper = app.state.runtime
            stopper.ready = False  # the runtime refuses new calls (as while draining)
            with pytest.raises(openai.InternalServerError) as info:
                client.chat.completions.create(
                    model="gpt-oss-120b", messages=[{"role": "user", "content": "x"}]
                )
            assert info.value.status_code == 503
            assert info.value.response.headers["retry-after"] == "1"


def test_runtime_process_drains_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    config = _node_file(tmp_path, "rt-c", 1.0)  # real time: a call takes seconds
    talaria = Path(sys.executable).parent / "talaria"
    proc = subprocess.Popen(
        [str(talaria), "runtime", "--config", str(config), "--port", str(port),
         "--log-level", "info"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # wait for uvicorn's startup line, not a timer
            if "Application startup complete" in line:
                break
        url = f"http://127.0.0.1:{port}"
        request = CallRequest("long", "s1", "glm-4.5-fp8", 4000, 200, stream=True)
        with httpx.stream(
            "POST", url + "/v1/runtime/generate", json=request_to_dict(request), timeout=120
        ) as response:
            lines = response.iter_lines()
            first = json.loads(next(lines))
            assert first["type"] == "first"
            proc.send_signal(signal.SIGTERM)  # drain: the call in flight must still finish
            rest = [json.loads(line) for line in lines if line]
        assert rest[-1]["type"] == "finished" and rest[-1]["result"]["output_tokens"] == 200
        # uvicorn drains, shuts the lifespan down, then re-raises the signal it caught
        assert proc.wait(timeout=120) in (0, -signal.SIGTERM)
        assert proc.stderr is not None
        log = proc.stderr.read()
        assert "Waiting for application shutdown" in log and "Application shutdown complete" in log
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/healthz")
    finally:
        if proc.poll() is None:
            proc.kill()
