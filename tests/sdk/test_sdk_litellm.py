"""The real ``litellm`` against the real proxy: the ``talaria/`` provider (completion,
streaming, acompletion, astreaming, with tool calls) and the plain ``openai/`` route, each
agent's calls visible in the admin API as one session."""

from __future__ import annotations

import asyncio
import importlib
from types import ModuleType
from typing import Any

import pytest

from talaria.sdk import SESSION_ID, session
from talaria.sdk.litellm import PROVIDER, handler, register, route
from tests.integration.server import RunningProxy
from tests.sdk.support import MODEL, TOOLS, Admin

USER = [{"role": "user", "content": "fix the failing test " * 20}]


@pytest.fixture(scope="module")
def litellm() -> ModuleType:
    module = importlib.import_module("litellm")  # LITELLM_LOCAL_MODEL_COST_MAP: conftest
    module.suppress_debug_info = True
    register()
    return module


def _tool_round(reply: Any, messages: list[dict[str, Any]]) -> None:
    message = reply.choices[0].message
    calls = message.tool_calls or []
    messages.append(
        {
            "role": "assistant",
            "content": message.content or "",
            "tool_calls": [
                {"id": c.id, "type": "function", "function": c.function.model_dump()} for c in calls
            ],
        }
    )
    messages.extend({"role": "tool", "tool_call_id": c.id, "content": "ok"} for c in calls)


def test_provider_agent_is_one_session(
    litellm: ModuleType, proxy: RunningProxy, admin: Admin
) -> None:
    messages: list[dict[str, Any]] = list(USER)
    kwargs = {"model": f"talaria/{MODEL}", "api_base": proxy.v1, "api_key": "k"}
    with session() as s:
        reply = litellm.completion(messages=messages, tools=TOOLS, **kwargs)
        assert reply.choices[0].finish_reason == "tool_calls" and s.in_tool_gap
        _tool_round(reply, messages)
        chunks = list(litellm.completion(messages=messages, tools=TOOLS, stream=True, **kwargs))
        calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        assert calls[0].function.name == "bash" and calls[0].id
        assert "".join(tc.function.arguments or "" for tc in calls) == '{"command": "ls"}'
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": calls[0].id,
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"simulated": true}'},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "ok"})
        text = "".join(
            c.choices[0].delta.content or ""
            for c in litellm.completion(messages=messages, stream=True, **kwargs)
        )
        assert text.startswith("[simulated]")
        assert s.calls == 3 and s.tool_calls == 2 and len(s.gaps_s) == 2
    detail = admin(f"/admin/sessions/{s.id}")
    assert detail["session"]["state"] == "ended" and detail["session"]["calls"] == 3
    assert [c["stream"] for c in detail["calls"]] == [False, True, True]
    reasons = [c["finish_reason"] for c in detail["calls"]]
    assert reasons[:2] == ["tool_calls", "tool_calls"] and reasons[2] in ("stop", "length")
    assert detail["calls"][1]["cached_tokens"] > 0 and len(detail["tool_gaps"]) == 2


def test_async_provider_concurrent_sessions(
    litellm: ModuleType, proxy: RunningProxy, admin: Admin
) -> None:
    kwargs = {"model": f"talaria/{MODEL}", "api_base": proxy.v1, "api_key": "k"}

    async def agent() -> str:
        async with session() as s:
            reply = await litellm.acompletion(messages=USER, tools=TOOLS, **kwargs)
            assert reply.choices[0].message.tool_calls
            stream = await litellm.acompletion(messages=USER, tools=TOOLS, stream=True, **kwargs)
            chunks = [chunk async for chunk in stream]
            assert chunks[-1].choices[0].finish_reason == "tool_calls"
            return s.id

    async def main() -> list[str]:
        return list(await asyncio.gather(*(agent() for _ in range(4))))

    for sid in asyncio.run(main()):
        detail = admin(f"/admin/sessions/{sid}")
        assert detail["session"]["calls"] == 2 and detail["session"]["state"] == "ended"
        assert [c["stream"] for c in detail["calls"]] == [False, True]


@pytest.mark.parametrize(
    "how",
    [
        {"litellm_session_id": "{sid}"},
        {"metadata": {"session_id": "{sid}"}},
        {"metadata": {"talaria_session_id": "{sid}", "talaria_parent_session_id": "p-{sid}"}},
        {"extra_headers": {SESSION_ID: "{sid}"}},
    ],
)
def test_provider_session_from_litellm_params(
    litellm: ModuleType, proxy: RunningProxy, admin: Admin, how: dict[str, Any]
) -> None:
    sid = f"lt-{abs(hash(repr(how))) % 10**8}"
    filled = {
        k: (
            {kk: vv.format(sid=sid) for kk, vv in v.items()}
            if isinstance(v, dict)
            else v.format(sid=sid)
        )
        for k, v in how.items()
    }
    parent = None
    if "talaria_parent_session_id" in str(how):  # a parent must be a live session of the tenant
        litellm.completion(
            model=f"talaria/{MODEL}", messages=USER, api_base=proxy.v1, api_key="k",
            metadata={"talaria_session_id": f"p-{sid}"},
        )  # fmt: skip
        parent = admin(f"/admin/sessions/p-{sid}")["session"]["session_key"]
    for _ in range(2):
        litellm.completion(
            model=f"talaria/{MODEL}", messages=USER, api_base=proxy.v1, api_key="k", **filled
        )
    detail = admin(f"/admin/sessions/{sid}")
    assert detail["session"]["calls"] == 2
    assert detail["session"]["parent_session_key"] == parent


def test_plain_openai_route(litellm: ModuleType, proxy: RunningProxy, admin: Admin) -> None:
    with session() as s:
        for _ in range(2):
            litellm.completion(
                model=f"openai/{MODEL}", messages=USER, **route(proxy.v1, api_key="k")
            )
        assert route(proxy.v1)["extra_headers"] == {SESSION_ID: s.id}
        assert s.base_urls == [proxy.v1]
    assert route(proxy.v1) == {"api_base": proxy.v1, "extra_headers": {}}
    detail = admin(f"/admin/sessions/{s.id}")
    assert detail["session"]["calls"] == 2 and detail["session"]["state"] == "ended"


def test_proxy_config_path_resolves_the_handler(litellm: ModuleType) -> None:
    from litellm.proxy.types_utils.utils import get_instance_fn

    assert get_instance_fn("talaria.sdk.litellm.talaria_llm") is handler()
    entry = next(e for e in litellm.custom_provider_map if e["provider"] == PROVIDER)
    assert entry["custom_handler"] is handler()
