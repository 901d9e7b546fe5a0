"""One entry never stops a node nor takes it out of routing (issue 46, item 4), through the real
HTTP stack: a placement with a string, NaN, infinite or huge rate is a 400 naming the field and
the node serves on; a name with ``/`` is refused and a variant name (``@``) is placed and
removed; a model whose numbers are not finite is left out of the runtime's status (valid JSON)
and the proxy routes the other models; a proxy reading an older runtime that writes NaN leaves
out that entry only."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import msgspec
import openai
import pytest
from fastapi import FastAPI
from fastapi.responses import Response

from talaria.core.protocol_status import status_to_dict
from talaria.core.status import InstanceStatus, ModelResidency, ModelState
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.runtimes.http import HttpRuntime
from talaria.runtime.config import load_node_config
from talaria.runtime.engine import Engine
from talaria.runtime.engine_kinds import ENGINES, EngineKind, EngineSite
from talaria.runtime.engines.sim import SimEngine
from talaria.runtime.placement_rules import PlacementRules
from talaria.runtime.server import create_runtime_app
from tests.fake_upstream import fake_upstream_thread
from tests.integration.server import running_app, running_proxy

NODE_TOML = """
[node]
name = "rt-entries"
quantum_s = 30
time_scale = 500

[[model]]
name = "glm-4.5-fp8"
engine = "sim"
"""


@contextmanager
def _runtime(tmp_path: Path, upstream_url: str | None = None) -> Iterator[str]:
    """A runtime with the node TOML's model that places upstreams under ``upstream_url``
    (None: none)."""
    path = tmp_path / "node.toml"
    path.write_text(NODE_TOML)
    rules = PlacementRules(upstream_urls=(upstream_url,) if upstream_url else ())
    with running_app(create_runtime_app(load_node_config(path), rules=rules)) as url:
        yield url


@contextmanager
def _client(tmp_path: Path, runtime: str) -> Iterator[openai.OpenAI]:
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path}/p.db", runtimes=[runtime], status_ttl_s=0
    )
    with running_proxy(settings) as proxy:
        yield openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0, timeout=60)


def _answered(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": f"a call to {model}"}]
    )
    assert reply.model == model and reply.usage is not None and reply.usage.completion_tokens > 0


def test_a_bad_rate_in_a_placement_is_a_400_naming_it_and_the_node_serves_on(
    tmp_path: Path,
) -> None:
    with fake_upstream_thread() as fake, _runtime(tmp_path, fake.url) as runtime:
        models = runtime + "/v1/runtime/models"
        entry = f'{{"name": "up", "engine": "openai", "url": "{fake.url}", "served_model": '
        entry += '"fake-model", "rates": {"prefill_s_per_token": %s}}'
        for rate, reason in [
            ('"1e-4"', "must be a number, not the string '1e-4'"),  # stopped the node before
            ("NaN", "must be a finite number, not nan"),  # Python's JSON parser takes these
            ("Infinity", "must be a finite number, not inf"),
            ("1e400", "must be a finite number, not inf"),
            ("1e308", "must be in [0, 1] s per token, not 1e+308"),
            ("true", "must be a number, not true"),
        ]:
            answer = httpx.post(models, content=entry % rate, timeout=30)
            assert answer.status_code == 400, (rate, answer.text)
            error = answer.json()["error"]
            assert f"model up: rates.prefill_s_per_token {reason}" in error, error
        assert httpx.get(runtime + "/v1/runtime/status").json()["model_names"] == ["glm-4.5-fp8"]
        assert httpx.get(runtime + "/readyz").status_code == 200
        placed = httpx.post(models, content=entry % "2e-5", timeout=30)
        assert placed.status_code == 201, placed.text
        with _client(tmp_path, runtime) as client:
            _answered(client, "glm-4.5-fp8")
            _answered(client, "up")
            _answered(client, "glm-4.5-fp8")


def test_a_name_outside_the_grammar_is_refused_and_a_variant_is_placed_and_removed(
    tmp_path: Path,
) -> None:
    with fake_upstream_thread() as fake, _runtime(tmp_path, fake.url) as runtime:
        models = runtime + "/v1/runtime/models"
        upstream = {"engine": "openai", "url": fake.url, "served_model": "fake-model"}
        for name in ("org/up", "Up", "../up", "up@a@b"):
            entry = {"name": name, **upstream}
            answer = httpx.post(models, json=entry, timeout=30)
            assert answer.status_code == 400, (name, answer.text)
            assert f"model name {name!r} is not a model name" in answer.json()["error"]
        # before: 'org/up' was placed, and its DELETE found no route (404) for good
        assert httpx.delete(models + "/org/up", timeout=60).status_code == 404
        placed = httpx.post(models, json={"name": "up@v2", **upstream}, timeout=30)
        assert placed.status_code == 201, placed.text
        removed = httpx.delete(models + "/up@v2", timeout=60)
        assert removed.status_code == 200, removed.text
        assert removed.json()["model_names"] == ["glm-4.5-fp8"]


class _UnboundedSwitch(SimEngine):
    """A simulated engine whose switch estimate is infinite (what a rate of 1e308 s made of
    the upstream engine's before the door checked it)."""

    def switch_in_s(self) -> float:
        return float("inf")


def test_a_model_with_an_infinite_estimate_is_left_out_and_the_others_are_routed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def build(site: EngineSite) -> Engine:
        engine = ENGINES["sim"].build(site)
        engine.__class__ = _UnboundedSwitch
        return engine

    monkeypatch.setitem(ENGINES, "unbounded", EngineKind(build, uses_node_memory=True))
    with _runtime(tmp_path) as runtime:
        entry = {"name": "gpt-oss-120b", "engine": "unbounded"}
        placed = httpx.post(runtime + "/v1/runtime/models", json=entry, timeout=60)
        assert placed.status_code == 201, placed.text
        raw = httpx.get(runtime + "/v1/runtime/status").content
        status = msgspec.json.decode(raw)  # strict JSON: no NaN, no Infinity
        assert status["model_names"] == ["glm-4.5-fp8", "gpt-oss-120b"]
        assert set(status["models"]) == {"glm-4.5-fp8"}
        assert "models.gpt-oss-120b" in caplog.text
        with _client(tmp_path, runtime) as client:
            _answered(client, "glm-4.5-fp8")
            with pytest.raises(openai.APIStatusError) as refused:
                _answered(client, "gpt-oss-120b")
            assert refused.value.status_code == 503
            _answered(client, "glm-4.5-fp8")


def _older_runtime() -> FastAPI:
    """A runtime from before the door: its status writes NaN into one model's entry."""
    good = ModelResidency("a", ModelState.ACTIVE, 0.0)
    bad = ModelResidency("b", ModelState.HOST, float("nan"), switch_s=float("inf"))
    status = InstanceStatus("old-rt", 1.0, "a", {"a": good, "b": bad}, reserved={"s": 1e9})
    document = status_to_dict(status, model_names=["a", "b"], engines={})
    app = FastAPI()

    @app.get("/v1/runtime/status")
    async def status_route() -> Response:
        return Response(json.dumps(document), media_type="application/json")

    return app


def test_the_proxy_leaves_out_only_the_entry_an_older_runtime_wrote_nan_into(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)
    with running_app(_older_runtime()) as url:
        client = HttpRuntime(url, status_ttl_s=0)

        async def read() -> InstanceStatus:
            try:
                await client.start()
                return await client.status()
            finally:
                await client.close()

        status = asyncio.run(read())
    assert client.models == ("a", "b")
    assert set(status.models) == {"a"} and status.reserved == {"s": 1e9}
    assert "models.b" in caplog.text
