"""Faults through the real HTTP stack: a runtime that fails before or during a call, and a
client that goes away mid-stream. The caller gets OpenAI-format errors; nothing is lost."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from talaria.core.types import CallRejected, CallRequest, GenerationEvent, TokenDelta
from talaria.proxy.contract.settings import ProxySettings
from talaria.runtime.instant import InstantRuntime
from tests.integration.server import running_proxy

ADMIN = "admin-secret-token"
MODEL = "bench-model"


class ScriptedRuntime(InstantRuntime):
    """InstantRuntime that can fail before the first token, fail after it, or wait for the
    test before finishing (and tell the test when it has)."""

    def __init__(self, mode: str) -> None:
        super().__init__((MODEL,), output_tokens=8)
        self.mode = mode
        self.release = threading.Event()
        self.finished = threading.Event()
        self.closed = threading.Event()
        """Its stream was closed before its end (what makes an engine abort the call)."""

    async def generate(self, request: CallRequest) -> AsyncGenerator[GenerationEvent, None]:  # type: ignore[override]
        if self.mode == "fail-before":
            raise RuntimeError("engine crashed")
        if self.mode == "reject":
            raise CallRejected("context_length_exceeded", "prompt of 9000 tokens", "messages")
        try:
            async for event in super().generate(request):
                if self.mode == "fail-during" and isinstance(event, TokenDelta):
                    raise RuntimeError("engine crashed mid-call")
                if self.mode == "gated" and isinstance(event, TokenDelta):
                    await asyncio.to_thread(self.release.wait, 30)
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            self.closed.set()
            raise
        self.finished.set()


def _settings(tmp: Path) -> ProxySettings:
    return ProxySettings(database_url=f"sqlite+aiosqlite:///{tmp}/f.db", admin_token=ADMIN)


def test_runtime_failure_is_a_503_with_retry_after(tmp_path: Path) -> None:
    with running_proxy(_settings(tmp_path), runtimes=[ScriptedRuntime("fail-before")]) as proxy:
        response = httpx.post(
            proxy.v1 + "/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
            headers={"X-Talaria-Session-Id": "f1"},
        )
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        error = response.json()["error"]
        assert error["code"] == "runtime_unavailable" and "engine crashed" in error["message"]
        client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
        detail = httpx.get(
            proxy.base_url + "/admin/sessions/f1", headers={"Authorization": f"Bearer {ADMIN}"}
        ).json()
        assert [c["status"] for c in detail["calls"]] == ["error"]  # the failure is recorded


def test_a_call_the_engine_rejects_is_a_400_with_its_code(tmp_path: Path) -> None:
    with running_proxy(_settings(tmp_path), runtimes=[ScriptedRuntime("reject")]) as proxy:
        client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "x"}],
                extra_headers={"X-Talaria-Session-Id": "r1"},
            )
        assert info.value.code == "context_length_exceeded"
        assert info.value.param == "messages" and "9000 tokens" in info.value.message
        detail = httpx.get(
            proxy.base_url + "/admin/sessions/r1", headers={"Authorization": f"Bearer {ADMIN}"}
        ).json()
        assert [c["status"] for c in detail["calls"]] == ["error"]


def test_failure_during_a_stream_is_an_sse_error_frame(tmp_path: Path) -> None:
    with running_proxy(_settings(tmp_path), runtimes=[ScriptedRuntime("fail-during")]) as proxy:
        with httpx.stream(
            "POST",
            proxy.v1 + "/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True},
        ) as response:
            lines = [line for line in response.iter_lines() if line]
        assert response.status_code == 200
        assert any('"error"' in line and "mid-call" in line for line in lines)
        assert lines[-1] == "data: [DONE]"
        client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], stream=True
        )
        with pytest.raises(openai.APIError):
            list(stream)


def test_client_that_leaves_mid_stream_cancels_its_call_and_keeps_its_record(
    tmp_path: Path,
) -> None:
    """A client gone mid-stream: the runtime's stream is closed (an engine aborts the call
    there instead of generating for no one), and the call is recorded ``cancelled``."""
    runtime = ScriptedRuntime("gated")
    with running_proxy(_settings(tmp_path), runtimes=[runtime]) as proxy:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
        with httpx.stream(
            "POST",
            proxy.v1 + "/chat/completions",
            json=body,
            headers={"X-Talaria-Session-Id": "gone"},
        ) as response:
            first = next(response.iter_lines())
            assert first.startswith("data: ")
        assert runtime.closed.wait(30)  # the client has hung up: the call is stopped
        runtime.release.set()
        assert not runtime.finished.is_set()
        deadline = time.monotonic() + 30
        calls: list[dict[str, Any]] = []
        while not calls and time.monotonic() < deadline:  # the record's commit is batched
            detail = httpx.get(
                proxy.base_url + "/admin/sessions/gone",
                headers={"Authorization": f"Bearer {ADMIN}"},
            )
            calls = detail.json().get("calls", []) if detail.is_success else []
        (call,) = calls
        assert call["status"] == "cancelled" and "disconnected" in call["error"]


class UnreachableRuntime(InstantRuntime):
    """An instance whose status cannot be read (a dead runtime server)."""

    def __init__(self, name: str, models: tuple[str, ...]) -> None:
        super().__init__(models, name=name)

    async def status(self):  # type: ignore[no-untyped-def]
        raise ConnectionError("connection refused")


def test_an_unreachable_instance_is_routed_around_and_reported(tmp_path: Path) -> None:
    runtimes = [
        UnreachableRuntime("dead", (MODEL, "only-dead")),
        InstantRuntime((MODEL,), name="alive"),
    ]
    with running_proxy(_settings(tmp_path), runtimes=runtimes) as proxy:
        client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}]
        )
        assert raw.headers["x-talaria-instance"] == "alive"
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(
                model="only-dead", messages=[{"role": "user", "content": "x"}]
            )
        assert info.value.status_code == 503 and info.value.response.headers["retry-after"]
        instances = httpx.get(
            proxy.base_url + "/admin/instances", headers={"Authorization": f"Bearer {ADMIN}"}
        ).json()["data"]
        assert "connection refused" in instances[0]["error"] and instances[1]["name"] == "alive"
        assert [m.id for m in client.models.list()] == [MODEL, "only-dead"]
