"""A runtime that takes no connection (its process gone) while the proxy still holds a fresh
status of it: a call routed there never reached it, so it runs on another instance, streamed
or not, and its reply, record and decisions name where it ran; with no instance left, a 503
names the unreachable one. Real runtime servers and the proxy on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest

from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.runtimes.http import HttpRuntime
from talaria.runtime.config import load_node_config
from talaria.runtime.server import create_runtime_app
from tests.integration.server import RunningProxy, running_app, running_proxy

ADMIN = "unreachable-admin-token"
MODEL = "glm-4.5-fp8"
NODE_TOML = """
[node]
name = "{name}"
policy = "talaria"
time_scale = 500

[[model]]
name = "glm-4.5-fp8"
engine = "sim"
"""
STATUS_TTL_S = 3600.0
"""Longer than the test: the proxy routes on the status it read at start, so a stopped
runtime still looks alive to it (as a status a few ms old does in a real deployment)."""


class Fleet:
    """Two runtime servers (each stoppable on its own) behind one proxy."""

    def __init__(self, stack: ExitStack, tmp: Path) -> None:
        self.nodes: dict[str, ExitStack] = {}
        urls = []
        for name in ("rt-a", "rt-b"):
            path = tmp / f"{name}.toml"
            path.write_text(NODE_TOML.format(name=name))
            node = stack.enter_context(ExitStack())
            urls.append(node.enter_context(running_app(create_runtime_app(load_node_config(path)))))
            self.nodes[name] = node
        settings = ProxySettings(database_url=f"sqlite+aiosqlite:///{tmp}/p.db", admin_token=ADMIN)
        runtimes = [HttpRuntime(url, status_ttl_s=STATUS_TTL_S) for url in urls]
        self.proxy: RunningProxy = stack.enter_context(running_proxy(settings, runtimes))
        self.client = openai.OpenAI(base_url=self.proxy.v1, api_key="x", max_retries=0)

    def stop(self, name: str) -> None:
        """Stop the node's server: its port takes no connection from now on."""
        self.nodes[name].close()

    def timeline(self, session_key: str) -> dict:  # type: ignore[type-arg]
        response = httpx.get(
            f"{self.proxy.base_url}/admin/sessions/{session_key}",
            headers={"authorization": f"Bearer {ADMIN}"},
        )
        return response.json()  # type: ignore[no-any-return]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with ExitStack() as stack:
        yield Fleet(stack, tmp_path)


def _messages(turn: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": "fix the build " * 50 + str(turn)}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_routed_to_a_stopped_runtime_runs_on_another(fleet: Fleet, stream: bool) -> None:
    session = {"x-session-id": f"moving-{stream}"}
    first = fleet.client.chat.completions.with_raw_response.create(
        model=MODEL, messages=_messages(0), extra_headers=session, max_tokens=8
    )
    home = first.headers["x-talaria-instance"]
    other = ({"rt-a", "rt-b"} - {home}).pop()
    fleet.stop(home)  # the session's KV is there: its next call is routed there

    second = fleet.client.chat.completions.with_raw_response.create(
        model=MODEL, messages=_messages(1), extra_headers=session, max_tokens=8, stream=stream
    )
    parsed = second.parse()
    if stream:
        chunks = list(parsed)
        assert chunks[-1].choices[0].finish_reason is not None
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        assert parsed.choices[0].message.content
        assert second.headers["x-talaria-instance"] == other  # where it ran

    key = first.headers["x-talaria-session-key"]
    calls = fleet.timeline(key)["calls"]
    assert [(c["status"], c["instance"]) for c in calls] == [("ok", home), ("ok", other)]

    third = fleet.client.chat.completions.with_raw_response.create(
        model=MODEL, messages=_messages(2), extra_headers=session, max_tokens=8
    )
    assert third.headers["x-talaria-instance"] == other  # left out from now on


def test_with_every_runtime_stopped_the_call_gets_a_503_naming_them(fleet: Fleet) -> None:
    fleet.client.chat.completions.create(model=MODEL, messages=_messages(0), max_tokens=4)
    fleet.stop("rt-a")
    fleet.stop("rt-b")
    with pytest.raises(openai.APIStatusError) as refused:
        fleet.client.chat.completions.create(model=MODEL, messages=_messages(1), max_tokens=4)
    assert refused.value.status_code == 503
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["code"] == "runtime_unavailable"
    assert "unreachable" in error["message"]
