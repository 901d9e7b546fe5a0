"""A node whose scheduling loop ends is seen to end (issue 46, item 4): the calls waiting on it
fail with the reason instead of waiting for good, its runtime fails ``/readyz`` and
``/healthz`` (503 with the reason), its status is a 503 (every proxy leaves it out), placement
changes answer at once, and a proxy's embedded node shows it in ``/readyz`` and answers its
models' calls 503. The loops here are made to raise as a string in ``rates`` made them: a
``TypeError`` out of an engine's estimate, in the loop's admission pass."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock, run_virtual
from talaria.core.protocol_calls import request_to_dict
from talaria.core.types import CallRequest
from talaria.proxy.contract.settings import ProxySettings
from talaria.runtime.config import load_node_config
from talaria.runtime.engine import Engine
from talaria.runtime.engine_kinds import ENGINES, EngineKind, EngineSite
from talaria.runtime.engines.sim import SimEngine
from talaria.runtime.scheduling.calls import NodeStopped
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import policy_flags
from talaria.runtime.server import create_runtime_app
from talaria.runtime.sim_node import NodeSetup, build_sim_node
from tests.integration.server import running_app, running_proxy

NODE_TOML = """
[node]
name = "rt-loop"
quantum_s = 30
time_scale = 500

[[model]]
name = "glm-4.5-fp8"
engine = "sim"
"""
BROKEN = "gpt-oss-120b"
CRASH = "can't multiply sequence by non-int of type 'float'"


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every simulated engine of ``BROKEN`` raises out of ``needed_bytes`` (the admission
    pass asks it of each call it would admit)."""
    original = SimEngine.needed_bytes

    def needed_bytes(self: SimEngine, request: CallRequest) -> float:
        if self.model == BROKEN:
            raise TypeError(CRASH)
        return original(self, request)

    monkeypatch.setattr(SimEngine, "needed_bytes", needed_bytes)
    yield


def test_a_runtime_whose_loop_raised_fails_its_calls_and_both_probes(
    tmp_path: Path, broken: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def build(site: EngineSite) -> Engine:
        return ENGINES["sim"].build(site)

    monkeypatch.setitem(ENGINES, "plain", EngineKind(build, uses_node_memory=True))
    path = tmp_path / "node.toml"
    path.write_text(NODE_TOML)
    with running_app(create_runtime_app(load_node_config(path))) as runtime:
        models = runtime + "/v1/runtime/models"
        placed = httpx.post(models, json={"name": BROKEN, "engine": "plain"}, timeout=60)
        assert placed.status_code == 201, placed.text
        assert httpx.get(runtime + "/readyz").status_code == 200
        call = request_to_dict(CallRequest("r1", "s1", BROKEN, 10, 4))
        # before: the call waited for good (the client's timeout), and every later one too
        failed = httpx.post(runtime + "/v1/runtime/generate", json=call, timeout=60)
        assert failed.status_code == 200 and '"type":"error"' in failed.text
        assert "scheduling loop ended" in failed.text and CRASH in failed.text

        for probe, key in (("/readyz", "error"), ("/healthz", "node")):
            answer = httpx.get(runtime + probe)
            assert answer.status_code == 503, (probe, answer.text)
            assert "node rt-loop: its scheduling loop ended (TypeError(" in answer.json()[key]
        status = httpx.get(runtime + "/v1/runtime/status")
        assert status.status_code == 503 and CRASH in status.json()["error"]
        other = request_to_dict(CallRequest("r2", "s2", "glm-4.5-fp8", 10, 4))
        refused = httpx.post(runtime + "/v1/runtime/generate", json=other, timeout=60)
        assert refused.status_code == 503 and CRASH in refused.json()["error"]
        removed = httpx.delete(models + "/" + BROKEN, timeout=60)  # before: it hung
        assert removed.status_code == 503 and CRASH in removed.json()["error"]


def test_an_embedded_node_whose_loop_raised_is_a_503_and_not_ready(
    tmp_path: Path, broken: None
) -> None:
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path}/p.db",
        models=["glm-4.5-fp8", BROKEN],
        time_scale=500.0,
    )
    with running_proxy(settings) as proxy:
        client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0, timeout=60)
        assert httpx.get(proxy.base_url + "/readyz").status_code == 200
        for model in (BROKEN, "glm-4.5-fp8"):  # the first ends the loop; both are refused
            with pytest.raises(openai.APIStatusError) as refused:
                client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "hello"}]
                )
            assert refused.value.status_code == 503, model
        ready = httpx.get(proxy.base_url + "/readyz")
        assert ready.status_code == 503
        runtimes = ready.json()["checks"]["runtimes"]
        assert runtimes["reachable"] == []
        assert "node0: its scheduling loop ended (TypeError(" in runtimes["failed"]["node0"]


def test_calls_waiting_when_the_loop_ends_fail_and_a_retirement_ends(broken: None) -> None:
    """On the node itself (virtual time): a call of another model queued behind the one that
    ends the loop fails with ``NodeStopped`` (before: it waited for good), a later call is
    refused at once, and retiring a model returns (before: it waited for its queue)."""

    async def main() -> None:
        clock = LoopClock()
        setup = NodeSetup("h200x8", "default", (BROKEN, "glm-4.5-fp8"))
        node = build_sim_node(
            "n0", setup, load_catalog(), policy_flags("talaria"), SchedulerConfig(30.0), clock
        )
        node.start()
        calls = [
            asyncio.create_task(node.submit(CallRequest(f"r{i}", f"s{i}", model, 10, 4)))
            for i, model in enumerate([BROKEN, "glm-4.5-fp8"])
        ]
        ended = asyncio.gather(*calls, return_exceptions=True)
        for outcome in await asyncio.wait_for(ended, timeout=600):
            assert isinstance(outcome, NodeStopped), outcome
        assert node.failure is not None and CRASH in node.failure
        with pytest.raises(NodeStopped):
            await node.submit(CallRequest("r9", "s9", "glm-4.5-fp8", 10, 4))
        await asyncio.wait_for(node.retire("glm-4.5-fp8"), timeout=600)
        await node.stop()

    run_virtual(main())
