"""The official ``openai`` client's Responses API, and the OpenAI Agents SDK (its Responses model
and its Chat Completions model), against the proxy over real HTTP (uvicorn on a loopback port,
the embedded simulated runtime 500× faster than real time, a real SQLite file)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from talaria.proxy.contract.settings import ProxySettings
from tests.integration.server import RunningProxy, running_proxy

ADMIN = "admin-secret-token"
MODEL = "glm-4.5-fp8"
READ_FILE = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file.",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("responses")
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp}/proxy.db", admin_token=ADMIN, time_scale=500.0
    )
    with running_proxy(settings) as running:
        yield running


@pytest.fixture
def client(proxy: RunningProxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.v1, api_key="local", max_retries=0)


def test_create_text(client: openai.OpenAI) -> None:
    raw = client.responses.with_raw_response.create(
        model=MODEL, instructions="Be terse.", input="say hello", max_output_tokens=400
    )
    assert raw.headers["x-talaria-session-id"]
    response = raw.parse()
    assert response.object == "response" and response.status in ("completed", "incomplete")
    assert response.output_text.startswith("[simulated]")
    assert response.usage is not None and response.usage.input_tokens > 0
    assert response.usage.input_tokens_details.cached_tokens == 0


def test_stream_helper_accepts_the_event_sequence(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL, input="think, then answer", reasoning={"effort": "low"}
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.reasoning_text.delta" in kinds and "response.output_text.delta" in kinds
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text.startswith("[simulated]")
    numbers = []
    with client.responses.create(model=MODEL, input="again", stream=True) as events:
        numbers = [e.sequence_number for e in events]
    assert numbers == list(range(len(numbers)))


def test_function_calls_with_previous_response_id(
    client: openai.OpenAI, proxy: RunningProxy
) -> None:
    """Each turn sends only its new items; the proxy expands the chain, and the turns are one
    session (cached tokens on every continuation)."""
    response = client.responses.create(model=MODEL, input="read the readme", tools=[READ_FILE])
    chain = [response]
    for step in range(3):
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            break
        assert calls[0].name == "read_file"
        jsonschema.validate(json.loads(calls[0].arguments), READ_FILE["parameters"])
        outputs = [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "# hi"}]
        kwargs: dict[str, Any] = {
            "model": MODEL,
            "input": outputs,
            "tools": [READ_FILE],
            "previous_response_id": response.id,
        }
        if step == 1:  # streamed, with the helper that checks the events
            with client.responses.stream(**kwargs) as stream:
                response = stream.get_final_response()
        else:
            response = client.responses.create(**kwargs)
        chain.append(response)
    assert [len([i for i in r.output if i.type == "function_call"]) for r in chain] == [1, 1, 1, 0]
    assert chain[-1].output_text.startswith("[simulated]")
    assert all(r.usage and r.usage.input_tokens_details.cached_tokens > 0 for r in chain[1:])
    fetched = client.responses.retrieve(chain[1].id)
    assert fetched.id == chain[1].id and fetched.output[0].type == "function_call"
    items = list(client.responses.input_items.list(chain[1].id, order="asc"))
    assert [i.type for i in items] == ["message", "function_call", "function_call_output"]
    last = httpx.get(proxy.v1 + f"/responses/{chain[-1].id}").json()
    assert last["previous_response_id"] == chain[-2].id


def test_stateless_codex_style_turns_are_one_session(
    client: openai.OpenAI, proxy: RunningProxy
) -> None:
    """``store: false`` and the full input every time, as Codex sends it."""
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": "You are a coding agent."},
        {"type": "message", "role": "user", "content": "list the files " * 30},
    ]
    keys = set()
    for _ in range(3):
        raw = client.responses.with_raw_response.create(
            model=MODEL, input=items, tools=[READ_FILE], store=False
        )
        keys.add(raw.headers["x-talaria-session-key"])
        response = raw.parse()
        items += [item.model_dump(exclude_none=True) for item in response.output]
        for call in (i for i in response.output if i.type == "function_call"):
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": "ok"})
    assert len(keys) == 1
    detail = proxy.admin(f"/admin/sessions/{keys.pop()}")
    assert [c["cached_tokens"] > 0 for c in detail["calls"]] == [False, True, True]
    assert all(c["api"] == "responses" for c in detail["calls"])
    with pytest.raises(openai.NotFoundError):  # store: false keeps nothing
        client.responses.retrieve(f"resp_{detail['calls'][0]['request_id']}")


def test_structured_output(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"verdict": {"type": "string", "enum": ["pass", "fail"]}},
        "required": ["verdict"],
        "additionalProperties": False,
    }
    response = client.responses.create(
        model=MODEL,
        input="did the tests pass?",
        text={"format": {"type": "json_schema", "name": "verdict", "schema": schema}},
    )
    jsonschema.validate(json.loads(response.output_text), schema)


def test_delete_and_unknown_ids(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="keep me")
    assert client.responses.retrieve(response.id).id == response.id
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_nope")
    assert info.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_unknown_fields_of_input_items_are_not_stored(proxy: RunningProxy) -> None:
    """Fields an item type does not define (at the item and in its content parts) are not in
    the stored input items, nor carried into a continuation; the fields it defines are."""
    junk = "j" * 50_000
    items = [
        {"type": "message", "role": "user", "junk": junk,
         "content": [{"type": "input_text", "text": "read it", "junk": junk}]},
        {"type": "function_call", "call_id": "c1", "name": "read_file",
         "arguments": '{"path": "a"}', "junk": junk},
        {"type": "function_call_output", "call_id": "c1", "output": "# a", "junk": junk},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": junk},
    ]  # fmt: skip
    first = httpx.post(proxy.v1 + "/responses", json={"model": MODEL, "input": items}, timeout=30)
    assert first.status_code == 200, first.text
    follow = httpx.post(
        proxy.v1 + "/responses",
        json={"model": MODEL, "input": "go on", "previous_response_id": first.json()["id"]},
        timeout=30,
    )
    assert follow.status_code == 200, follow.text
    for response_id, count in ((first.json()["id"], 4), (follow.json()["id"], 6)):
        listed = httpx.get(proxy.v1 + f"/responses/{response_id}/input_items?order=asc")
        assert listed.status_code == 200
        stored = listed.json()["data"]
        assert len(stored) == count and junk not in listed.text
        assert stored[0]["content"] == [{"type": "input_text", "text": "read it"}]
        assert {k: stored[1][k] for k in ("call_id", "name", "arguments")} == {
            "call_id": "c1", "name": "read_file", "arguments": '{"path": "a"}'
        }  # fmt: skip
        assert stored[2]["output"] == "# a"
        assert stored[3] == {"type": "web_search_call", "id": "ws_1", "status": "completed"}


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": MODEL}, 400, "input"),
        ({"model": MODEL, "input": [{"type": "function_call", "name": "x"}]}, 400,
         "input.0.call_id"),
        ({"model": MODEL, "input": [{"type": "item_reference", "id": "i"}]}, 400, "input.0"),
        ({"model": MODEL, "input": "x", "tool_choice": {"type": "function", "name": "ghost"}},
         400, "tool_choice"),
        ({"model": MODEL, "input": "x", "text": {"format": {"type": "yaml"}}}, 400, "text.format"),
        ({"model": "nope", "input": "x"}, 404, "model"),
    ],
)  # fmt: skip
def test_bad_requests_in_openais_envelope(
    proxy: RunningProxy, body: dict[str, Any], status: int, param: str
) -> None:
    reply = httpx.post(proxy.v1 + "/responses", json=body)
    assert reply.status_code == status
    assert reply.json()["error"]["param"] == param


def test_store_off_by_setting(tmp_path: Path) -> None:
    settings = ProxySettings(
        database_url=f"sqlite+aiosqlite:///{tmp_path}/s.db", store_responses=False
    )
    with running_proxy(settings) as proxy:
        client = openai.OpenAI(base_url=proxy.v1, api_key="local", max_retries=0)
        response = client.responses.create(model=MODEL, input="x")
        assert response.store is False
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(response.id)


def test_agents_sdk_with_both_models(proxy: RunningProxy) -> None:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    listed: list[str] = []

    @function_tool
    def list_files(path: str) -> str:
        """List the files under a directory."""
        listed.append(path)
        return "a.py\nb.py"

    async def run(kind: str) -> str:
        client = openai.AsyncOpenAI(base_url=proxy.v1, api_key="local", max_retries=0)
        model: Any = (
            OpenAIResponsesModel(MODEL, client)
            if kind == "responses"
            else OpenAIChatCompletionsModel(MODEL, client)
        )
        agent = Agent(name="coder", instructions="Use the tools.", tools=[list_files], model=model)
        result = await Runner.run(agent, "what is in the repo?", max_turns=8)
        await client.close()
        return str(result.final_output)

    for kind in ("responses", "chat"):
        before = len(listed)
        final = asyncio.run(run(kind))
        assert final.startswith("[simulated]")
        assert len(listed) - before == 3  # three tool steps, then the answer
