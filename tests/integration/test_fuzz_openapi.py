"""Schemathesis against a live proxy, from its own ``/openapi.json``: every operation, with
requests valid against the document (positive) and requests that break it (negative).

Whatever is sent, the proxy answers without a 5xx, every response carries ``x-request-id``,
and every error is in the envelope of the API addressed (Anthropic's on ``/v1/messages``,
OpenAI's elsewhere). The request-body schemas (the dialects' pydantic models,
proxy/dialects/*/models.py, which also validate the bodies) are held honest both ways: a
positive body is answered 2xx, or refused only for what no schema states (a tool choice
naming a tool the request does not offer, a thinking budget not below ``max_tokens``, an
unknown stored response or session), every call route answers 2xx at least once; and the
bodies real clients send validate against them (``test_schemas_accept_what_clients_send``).

The runtime is ``InstantRuntime``, so no call waits on a simulated engine; the bodies' ``model``
is pinned to the one model it serves (else every call would be a 404). The budget is fixed and
derandomized (the same cases on every run, no example database); ``TALARIA_FUZZ_SCALE=10``
multiplies it for a deeper run by hand.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.specs.openapi.checks import response_schema_conformance

from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.dialects.anthropic.parse import parse_count_tokens, parse_messages
from talaria.proxy.dialects.chat.parse import parse_chat
from talaria.proxy.dialects.completions.parse import parse_completion
from talaria.proxy.dialects.responses.parse import parse_request, to_call
from talaria.runtime.instant import InstantRuntime
from tests.integration.server import RunningProxy, running_proxy

MODEL = "bench-model"
ADMIN = "admin-secret-token"
LIVE_SESSION = "fuzz-live-session"

OPERATIONS = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/sessions/{session_id}/hints"),
    ("GET", "/v1/models"),
    ("GET", "/v1/responses/{response_id}"),
    ("GET", "/v1/responses/{response_id}/input_items"),
    ("GET", "/admin/sessions"),
    ("GET", "/admin/sessions/{session_id}"),
    ("GET", "/admin/instances"),
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    # what ends or deletes what the operations above read, last
    ("DELETE", "/v1/responses/{response_id}"),
    ("POST", "/admin/sessions/{session_id}/end"),
    ("POST", "/v1/sessions/{session_id}/end"),
]
"""In the order they run. Operations of the live document not listed here are fuzzed too,
with the generic checks only (``test_fuzz_unlisted``)."""
CALLS = {
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
}
BODIES = {*CALLS, "/v1/sessions/{session_id}/hints"}
"""The routes whose request body the document declares."""

SCALE = float(os.environ.get("TALARIA_FUZZ_SCALE", "1"))
BODY_EXAMPLES = {
    GenerationMode.POSITIVE: round(50 * SCALE),
    GenerationMode.NEGATIVE: round(150 * SCALE),
}
OTHER_EXAMPLES = round(10 * SCALE)
MODES = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]

SEMANTIC = (
    "which is not among the tools",  # tool_choice names a tool the request does not offer
    "Response with id",  # an unknown previous_response_id or stored response (404)
    "No live session",  # a hint for a session that is not live (404)
    "must be less than max_tokens",  # a thinking budget not below the request's max_tokens
)
"""Refusals of a body valid against the schema that no JSON schema can state."""


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("fuzz")
    cfg = ProxySettings(database_url=f"sqlite+aiosqlite:///{tmp}/f.db", admin_token=ADMIN)
    with running_proxy(cfg, runtimes=[InstantRuntime((MODEL,), output_tokens=4)]) as running:
        yield running


@pytest.fixture(scope="module")
def document(proxy: RunningProxy) -> dict[str, Any]:
    """The live document, as schemathesis loads it from the proxy."""
    loaded = schemathesis.openapi.from_url(proxy.base_url + "/openapi.json")
    return copy.deepcopy(dict(loaded.raw_schema))


@pytest.fixture(scope="module")
def schema(document: dict[str, Any]) -> schemathesis.BaseSchema:
    """The live document with each body's ``model`` pinned to the model served."""
    pinned = copy.deepcopy(document)
    for path in CALLS:
        body = pinned["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        body["schema"]["properties"]["model"] = {"type": "string", "enum": [MODEL]}
    return schemathesis.openapi.from_dict(pinned)


@pytest.fixture(scope="module")
def stored_response(proxy: RunningProxy) -> str:
    """A stored response (``{response_id}`` routes reach it) and a live session
    (``{session_id}`` routes reach it)."""
    reply = httpx.post(proxy.v1 + "/responses", json={"model": MODEL, "input": "hi"})
    assert reply.status_code == 200, reply.text
    chat = httpx.post(
        proxy.v1 + "/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-talaria-session-id": LIVE_SESSION},
    )
    assert chat.status_code == 200, chat.text
    response_id: str = reply.json()["id"]
    return response_id


@pytest.fixture(scope="module")
def answered() -> dict[str, list[int]]:
    """Statuses of the positive cases per call route (``test_every_call_route_answered``)."""
    return {}


def _header(response: schemathesis.Response, name: str) -> str:
    for key, values in response.headers.items():
        if key.lower() == name:
            return str(values[0] if isinstance(values, list) else values)
    return ""


def _error_envelope(path: str, body: Any) -> bool:
    if not isinstance(body, dict):
        return False
    error = body.get("error")
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return False
    if path.startswith("/v1/messages"):  # Anthropic's: {"type": "error", "error": {type, message}}
        return body.get("type") == "error" and isinstance(error.get("type"), str)
    return isinstance(error.get("type"), str)  # OpenAI's: {"error": {message, type, ...}}


def _breakable(operation: Any) -> bool:
    """Whether a negative case exists: a body, or a parameter narrower than any string."""
    if "requestBody" in operation.definition.raw:
        return True
    for parameter in operation.definition.raw.get("parameters", []):
        text = json.dumps(parameter.get("schema", {}))
        if any(f'"{k}"' in text for k in ("integer", "number", "enum", "pattern")):
            return True
    return False


def _strategy(operation: Any, mode: GenerationMode, stored_response: str) -> Any:
    """Generated cases; on ``{session_id}`` / ``{response_id}`` routes, half of them address the
    live session / the stored response, so the 200 paths are reached too."""
    strategies = [operation.as_strategy(generation_mode=mode)]
    path = operation.path
    if "{session_id}" in path:
        fixed = {"session_id": LIVE_SESSION}
        strategies.append(operation.as_strategy(generation_mode=mode, path_parameters=fixed))
    if "{response_id}" in path:
        fixed = {"response_id": stored_response}
        strategies.append(operation.as_strategy(generation_mode=mode, path_parameters=fixed))
    return st.one_of(strategies)


def _fuzz(
    proxy: RunningProxy,
    operation: Any,
    mode: GenerationMode,
    stored_response: str,
    answered: dict[str, list[int]],
) -> None:
    path = operation.path
    has_body = path in BODIES
    examples = BODY_EXAMPLES[mode] if has_body else OTHER_EXAMPLES
    session = requests.Session()
    headers = {"Authorization": f"Bearer {ADMIN}"}  # the admin token; any key is a tenant here
    # response_schema_conformance passes, but checks little yet: the document declares no
    # response bodies (200 is ``{}``; FastAPI's 422 ``HTTPValidationError`` requires no key).
    checks = [schemathesis.checks.not_a_server_error, response_schema_conformance]

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        print_blob=False,
    )
    @given(case=_strategy(operation, mode, stored_response))
    def run(case: Case) -> None:
        response = case.call(base_url=proxy.base_url, session=session, headers=headers, timeout=30)
        case.validate_response(response, checks=checks)
        assert _header(response, "x-request-id"), f"{response.status_code}: no x-request-id"
        status = response.status_code
        if mode is GenerationMode.POSITIVE and path in CALLS:
            answered.setdefault(path, []).append(status)
        if status >= 400:
            body = response.json()
            assert _error_envelope(path, body), f"{status}, not the error envelope: {body}"
            message = str(body["error"]["message"])
            if mode is GenerationMode.POSITIVE and has_body:
                assert any(s in message for s in SEMANTIC), (
                    f"a body valid against the declared schema was refused ({status}): "
                    f"{message}\nbody: {json.dumps(case.body)[:3000]}"
                )
        elif _header(response, "content-type").startswith("text/event-stream"):
            text = response.text
            for failed in ("event: error", "response.failed", 'data: {"error"'):
                assert failed not in text, f"the stream failed: {text[-2000:]}"

    run()


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_fuzz(
    proxy: RunningProxy,
    schema: schemathesis.BaseSchema,
    stored_response: str,
    answered: dict[str, list[int]],
    method: str,
    path: str,
    mode: GenerationMode,
) -> None:
    operation = schema[path][method]
    if mode is GenerationMode.NEGATIVE and not _breakable(operation):
        pytest.skip("no negative case: no body, and every parameter takes any string")
    _fuzz(proxy, operation, mode, stored_response, answered)


def test_fuzz_unlisted(
    proxy: RunningProxy,
    schema: schemathesis.BaseSchema,
    stored_response: str,
    answered: dict[str, list[int]],
) -> None:
    """Operations added to the proxy since OPERATIONS was written get the generic checks."""
    listed = set(OPERATIONS)
    for path, methods in schema.raw_schema["paths"].items():
        for method in methods:
            if (method.upper(), path) in listed:
                continue
            operation = schema[path][method.upper()]
            for mode in MODES:
                if mode is GenerationMode.POSITIVE or _breakable(operation):
                    _fuzz(proxy, operation, mode, stored_response, answered)


def test_every_call_route_answered(answered: dict[str, list[int]]) -> None:
    """The positive cases reached the 200 paths, not only refusals (runs after test_fuzz)."""
    if not answered:
        pytest.skip("test_fuzz did not run")
    for path in sorted(CALLS):
        statuses = answered.get(path, [])
        assert any(200 <= s < 300 for s in statuses), (path, statuses)


def test_document_declares_the_bodies(document: dict[str, Any]) -> None:
    live = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}
    assert set(OPERATIONS) <= live
    declared = {
        p for p, ops in document["paths"].items() for o in ops.values() if "requestBody" in o
    }
    assert declared == BODIES
    for path in BODIES:
        body = document["paths"][path]["post"]["requestBody"]
        assert body["required"] is True
        jsonschema.Draft202012Validator.check_schema(body["content"]["application/json"]["schema"])


# -- what real clients send validates against the declared schemas ---------------------------

_TOOL_PARAMS = {"type": "object", "properties": {"path": {"type": "string"}}, "required": []}
CLIENT_BODIES: list[tuple[str, dict[str, Any]]] = [
    (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "developer", "content": [{"type": "text", "text": "rules"}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "ls", "arguments": '{"path": "."}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "ls",
                        "description": "list",
                        "parameters": _TOOL_PARAMS,
                        "strict": False,
                    },
                }
            ],
            "tool_choice": {"type": "function", "function": {"name": "ls"}},
            "parallel_tool_calls": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_completion_tokens": 64,
            "temperature": 0.2,
            "top_p": 0.9,
            "stop": ["END"],
            "seed": 7,
            "logprobs": True,
            "top_logprobs": 2,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
            },
            "reasoning_effort": "low",
            "user": "u1",
            "prompt_cache_key": "task-42",
            "chat_template_kwargs": {"enable_thinking": False},
            "metadata": {"anything": "extra fields are accepted"},
        },
    ),
    (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "tool_choice": "none",
            "response_format": {"type": "json_object"},
            "n": 1,
            "stop": "END",
            "presence_penalty": -1.5,
            "frequency_penalty": 0,
            "top_k": -1,
        },
    ),
    ("/v1/completions", {"model": MODEL, "prompt": "def f(", "max_tokens": 8, "logprobs": 1}),
    ("/v1/completions", {"model": MODEL, "prompt": ["one prompt"], "stream": True, "echo": False}),
    (
        "/v1/messages",
        {
            "model": MODEL,
            "max_tokens": 2048,
            "system": [
                {"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}
            ],
            "metadata": {"user_id": '{"session_id": "0b6a9c9e-8d9b-4c4e-9a39-1f7e3c1a2b3c"}'},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "tools": [
                {"name": "ls", "description": "list", "input_schema": _TOOL_PARAMS},
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
            ],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
            "stop_sequences": ["END"],
            "temperature": 1,
            "top_k": 5,
            "stream": True,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AA"},
                        },
                        {
                            "type": "document",
                            "source": {"type": "text", "media_type": "text/plain", "data": "doc"},
                        },
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "sig"},
                        {"type": "redacted_thinking", "data": "xx"},
                        {"type": "text", "text": "ok"},
                        {"type": "tool_use", "id": "t1", "name": "ls", "input": {"path": "."}},
                        {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "a.py"}],
                            "is_error": False,
                            "cache_control": {"type": "ephemeral"},
                        },
                        {"type": "tool_result", "tool_use_id": "t2", "content": "b.py"},
                    ],
                },
                {"role": "system", "content": "environment notes"},
            ],
        },
    ),
    (
        "/v1/messages",
        {
            "model": MODEL,
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "ls", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "ls"},
            "thinking": {"type": "disabled"},
        },
    ),
    (
        "/v1/messages/count_tokens",
        {"model": MODEL, "system": "be brief", "messages": [{"role": "user", "content": "hi"}]},
    ),
    (
        "/v1/responses",
        {
            "model": MODEL,
            "instructions": "be brief",
            "input": [
                {"role": "user", "content": "no type: a message"},
                {"type": "message", "role": "developer", "content": "rules"},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "go"}],
                },
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [{"type": "summary_text", "text": "hm"}],
                    "encrypted_content": None,
                },
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "ok", "annotations": []}],
                },
                {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "c1",
                    "name": "ls",
                    "arguments": "{}",
                    "status": "completed",
                },
                {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
                {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            ],
            "tools": [
                {"type": "function", "name": "ls", "parameters": _TOOL_PARAMS, "strict": True},
                {"type": "web_search"},
                {
                    "type": "namespace",
                    "name": "agents",
                    "tools": [{"type": "function", "name": "spawn", "parameters": None}],
                },
            ],
            "tool_choice": {"type": "function", "name": "ls"},
            "parallel_tool_calls": False,
            "store": False,
            "stream": True,
            "max_output_tokens": 64,
            "temperature": 0.5,
            "top_p": 1,
            "top_logprobs": 0,
            "text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": "object"}}},
            "reasoning": {"effort": "medium", "summary": "auto"},
            "metadata": {"k": "v"},
            "prompt_cache_key": "codex-thread",
            "user": "u1",
            "include": ["reasoning.encrypted_content"],
        },
    ),
    (
        "/v1/responses",
        {
            "model": MODEL,
            "input": "hi",
            "tool_choice": "auto",
            "text": {"format": {"type": "text"}},
        },
    ),
    ("/v1/sessions/{session_id}/hints", {"expected_s": 12.5, "tool": "pytest"}),
    ("/v1/sessions/{session_id}/hints", {"expected_ms": 800}),
]


def _parse(path: str, body: dict[str, Any]) -> None:
    if path == "/v1/chat/completions":
        parse_chat(body)
    elif path == "/v1/completions":
        parse_completion(body)
    elif path == "/v1/messages":
        parse_messages(body)
    elif path == "/v1/messages/count_tokens":
        parse_count_tokens(body)
    elif path == "/v1/responses":
        to_call(parse_request(body, "r"), [])


@pytest.mark.parametrize(("path", "body"), CLIENT_BODIES, ids=[p for p, _ in CLIENT_BODIES])
def test_schemas_accept_what_clients_send(
    document: dict[str, Any], path: str, body: dict[str, Any]
) -> None:
    """Bodies shaped as the SDKs and agents send them: the parser takes them, so the declared
    schema must too."""
    _parse(path, body)
    declared = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    schema = {**declared["schema"], "components": document["components"]}  # where $refs point
    jsonschema.validate(body, schema, cls=jsonschema.Draft202012Validator)
