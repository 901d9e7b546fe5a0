"""The SDK against OpenAI-compatible servers that are not Talaria: the session headers are
harmless, the Responses API and ``parse`` work, nothing is sent to session endpoints that do
not exist, and when hints or ends fail the agent never notices."""

from __future__ import annotations

import json
import logging

import httpx2
import pytest
from pydantic import BaseModel

from talaria.sdk import AsyncOpenAI, OpenAI, SideChannel, session
from talaria.sdk.headers import SESSION_ID, TOOL_GAP_MS
from tests.sdk.support import MODEL, TOOLS, FakeServer

USER = [{"role": "user", "content": "hi"}]
RESPONSE_TOOLS = [{"type": "function", "name": "bash", "parameters": {"type": "object"}}]


class Answer(BaseModel):
    answer: str


def test_chat_responses_and_parse_against_another_server(foreign: FakeServer) -> None:
    client = OpenAI(base_url=foreign.v1, api_key="k", max_retries=0)
    with session() as s:
        reply = client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS)
        assert reply.choices[0].message.tool_calls and s.in_tool_gap
        text = "".join(
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(model=MODEL, messages=USER, stream=True)
        )
        assert text == "hello" and not s.in_tool_gap
        parsed = client.chat.completions.parse(model=MODEL, messages=USER, response_format=Answer)
        assert parsed.choices[0].message.parsed == Answer(answer="42")
        response = client.responses.create(model=MODEL, input="hi")
        assert response.output_text == "hello" and not s.in_tool_gap
        response = client.responses.create(model=MODEL, input="hi", tools=RESPONSE_TOOLS)
        assert response.output[0].type == "function_call" and s.in_tool_gap
        events = list(client.responses.create(model=MODEL, input="hi", stream=True))
        assert [e.type for e in events] == ["response.created", "response.completed"]
        assert not s.in_tool_gap and s.tool_calls == 2
        s.tool_gap(5.0, "make")  # the server is known not to be Talaria: nothing is sent
    headers = foreign.seen.headers("/v1/")
    assert len(headers) == 6 and all(h[SESSION_ID.lower()] == s.id for h in headers)
    assert headers[0][TOOL_GAP_MS.lower()] == "3000"
    assert not any("/sessions/" in p for p in foreign.seen.paths())


@pytest.mark.asyncio
async def test_async_responses_stream_against_another_server(foreign: FakeServer) -> None:
    client = AsyncOpenAI(base_url=foreign.v1, api_key="k", max_retries=0)
    async with session() as s:
        stream = await client.responses.create(
            model=MODEL,
            input="hi",
            tools=RESPONSE_TOOLS,
            stream=True,
        )
        kinds = [event.type async for event in stream]
        assert kinds[-1] == "response.completed" and s.in_tool_gap
        raw = await client.responses.with_raw_response.create(model=MODEL, input="hi")
        assert raw.parse().output_text == "hello"
    await client.close()
    assert [h[SESSION_ID.lower()] for h in foreign.seen.headers("/v1/")] == [s.id, s.id]
    assert not any("/sessions/" in p for p in foreign.seen.paths())


def test_failing_hints_and_end_are_swallowed(
    broken_talaria: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = OpenAI(base_url=broken_talaria.v1, api_key="k", max_retries=0)
    with caplog.at_level(logging.WARNING, logger="talaria.sdk"), session("broken") as s:
        client.chat.completions.create(model=MODEL, messages=USER, tools=TOOLS)
        s.tool_gap(expected_s=2.0, tool="pytest")
    assert s.ended
    paths = broken_talaria.seen.paths()
    assert paths.count("/v1/sessions/broken/hints") == 1
    assert paths.count("/v1/sessions/broken/end") == 1
    hint = next(b for _, p, _, b in broken_talaria.seen.requests if p.endswith("/hints"))
    assert hint == {"expected_s": 2.0, "tool": "pytest"}
    assert sum("answered 500" in r.getMessage() for r in caplog.records) == 2


def test_unreachable_session_endpoints_are_swallowed(closed_port_url: str) -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        body = {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hi"},
                    "finish_reason": "stop",
                }
            ],
        }
        sid = request.headers.get(SESSION_ID, "")
        return httpx2.Response(200, json=body, headers={"x-talaria-session-id": sid})

    http = httpx2.Client(transport=httpx2.MockTransport(handler))
    client = OpenAI(base_url=closed_port_url, api_key="k", http_client=http, max_retries=0)
    channel = SideChannel(timeout_s=1.0)
    with session(channel=channel) as s:
        client.chat.completions.create(model=MODEL, messages=USER)
        s.tool_gap(1.0)
    assert s.ended and s.base_urls == [closed_port_url]
    channel.close()
    assert json.dumps(s.headers())  # still usable after its end
