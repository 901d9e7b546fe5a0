"""One request must never stall a node: a tool or response-format schema whose instance is
enormous (``minItems: 1000000000``, a ``$ref`` that requires itself many times) is refused with
a 400 in each API's envelope, on `talaria serve` with its embedded runtime and on `talaria serve
--runtime` in front of a `talaria runtime` process, while /healthz keeps answering and the next
call is served. Sent straight to the runtime (past the proxy's edge check), the simulated engine
refuses it with the same code and the node goes on. Before the builder had a budget, each of
these spun the event loop at 100% CPU for good."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.harness.processes import ServeProcess, talaria_runtime, talaria_serve
from talaria.core.protocol_calls import request_to_dict
from talaria.core.types import CallRequest

MODEL = "glm-4.5-fp8"
ANSWER_S = 10.0
"""Each refusal, and each /healthz meanwhile, must come well within this."""

BOMB = {"type": "object", "required": ["xs"], "properties": {"xs": {
    "type": "array", "minItems": 1_000_000_000, "items": {"type": "string"}}}}  # fmt: skip
RECURSIVE = {
    "$defs": {"n": {"type": "object", "required": [f"k{i}" for i in range(40)],
                    "properties": {f"k{i}": {"$ref": "#/$defs/n"} for i in range(40)}}},
    "$ref": "#/$defs/n",
}  # fmt: skip
"""40^8 values without a budget."""

NODE_TOML = """
[node]
name = "bomb-node"
time_scale = 200

[[model]]
name = "glm-4.5-fp8"
engine = "sim"
"""


def _fmt(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


def _requests(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any], str, str]]:
    """(path, body, the param the error names, the error envelope) of a bomb on each API."""
    user = [{"role": "user", "content": "list the files"}]
    chat_tool = {"type": "function", "function": {"name": "ls", "parameters": schema}}
    resp_tool = {"type": "function", "name": "ls", "parameters": schema}
    return [
        ("/v1/chat/completions", {"model": MODEL, "messages": user, "tools": [chat_tool]},
         "tools[0]", "openai"),
        ("/v1/chat/completions", {"model": MODEL, "messages": user,
                                  "response_format": _fmt(schema)}, "response_format", "openai"),
        ("/v1/messages", {"model": MODEL, "max_tokens": 64, "messages": user,
                          "tools": [{"name": "ls", "input_schema": schema}]},
         "tools[0]", "anthropic"),
        ("/v1/responses", {"model": MODEL, "input": "list the files", "tools": [resp_tool]},
         "tools[0]", "openai"),
        ("/v1/responses", {"model": MODEL, "input": "list the files",
                           "text": {"format": {"type": "json_schema", "name": "out",
                                               "schema": schema}}}, "text.format", "openai"),
    ]  # fmt: skip


def _assert_refused(response: httpx.Response, param: str, envelope: str) -> None:
    assert response.status_code == 400, response.text
    body = response.json()
    if envelope == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert "too large" in body["error"]["message"]
    else:
        assert body["error"]["code"] == "schema_too_large"
        assert body["error"]["param"] == param


def _bombard(served: ServeProcess) -> None:
    """Every bomb on every API, each sent while /healthz is polled from another thread."""
    with httpx.Client(base_url=served.base_url, timeout=ANSWER_S) as http:
        for schema in (BOMB, RECURSIVE):
            for path, body, param, envelope in _requests(schema):
                with concurrent.futures.ThreadPoolExecutor(1) as pool:
                    health = pool.submit(http.get, "/healthz")
                    _assert_refused(http.post(path, json=body), param, envelope)
                    assert health.result().status_code == 200
        fine = http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert fine.status_code == 200, fine.text
        assert http.get("/readyz").status_code == 200


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[ServeProcess]:
    config = tmp_path / "node.toml"
    config.write_text(NODE_TOML)
    with talaria_runtime(config) as served:
        yield served


def test_schema_bombs_are_400s_on_the_embedded_runtime(tmp_path: Path) -> None:
    args = ["--models", MODEL, "--time-scale", "200"]
    with talaria_serve(args, {}, tmp_path) as served:
        _bombard(served)


def test_schema_bombs_are_400s_through_a_runtime_process(
    tmp_path: Path, runtime: ServeProcess
) -> None:
    with talaria_serve(["--runtime", runtime.base_url], {}, tmp_path) as served:
        _bombard(served)
    assert httpx.get(runtime.base_url + "/healthz", timeout=ANSWER_S).status_code == 200


def test_a_runtime_called_directly_refuses_a_bomb_and_serves_on(runtime: ServeProcess) -> None:
    """Past the proxy's edge check: the simulated engine builds with the same budget."""
    from talaria.core.calls import Call, ToolChoice, ToolSpec

    bomb = CallRequest(
        "bomb-1", "s1", MODEL, 100, 64, call=Call(
            MODEL, messages=({"role": "user", "content": "ls"},),
            tools=(ToolSpec("ls", parameters=BOMB),), tool_choice=ToolChoice("required"),
        ),
    )  # fmt: skip
    fine = CallRequest("fine-1", "s2", MODEL, 100, 8)
    with httpx.Client(base_url=runtime.base_url, timeout=ANSWER_S) as http:
        refused = http.post("/v1/runtime/generate", json=request_to_dict(bomb))
        events = [json.loads(line) for line in refused.text.splitlines() if line]
        assert events[-1]["type"] == "error" and events[-1]["code"] == "schema_too_large", events
        assert http.get("/healthz").status_code == 200
        served = http.post("/v1/runtime/generate", json=request_to_dict(fine))
        assert json.loads(served.text.splitlines()[-1])["type"] == "finished"
