"""The placement controller against live runtime servers over HTTP (proxy/placement/loop.py,
runtime/placement_routes.py): a call for a library model that no runtime hosts is served
after its cold start; a model a runtime drains takes only its own sessions there."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from talaria.core.catalog import load_catalog
from talaria.proxy.contract.settings import ProxySettings
from talaria.runtime.config import load_node_config
from talaria.runtime.server import create_runtime_app
from tests.integration.server import RunningProxy, running_app, running_proxy

ADMIN = "admin-secret-token"
NODE = """
[node]
name = "{name}"
quantum_s = 30
time_scale = 500
{models}
"""
LIBRARY = """
[[model]]
name = "gpt-oss-120b"
engine = "sim"

[[model]]
name = "minimax-m2"
engine = "vllm"
path = "{absent}"
"""


def _node(tmp_path: Path, name: str, *models: str) -> Path:
    entries = "".join(f'\n[[model]]\nname = "{m}"\nengine = "sim"\n' for m in models)
    path = tmp_path / f"{name}.toml"
    path.write_text(NODE.format(name=name, models=entries))
    return path


@contextmanager
def _fleet(
    tmp_path: Path, *nodes: tuple[str, ...], **placement: float
) -> Iterator[tuple[RunningProxy, list[str]]]:
    """Runtime servers hosting ``nodes``' models, and a proxy with the placement library
    over them (its periodic looks an hour apart unless ``placement`` says otherwise: only
    cold starts move models here)."""
    library = tmp_path / "library.toml"
    library.write_text(LIBRARY.format(absent=tmp_path / "absent"))
    with ExitStack() as stack:
        urls = [
            stack.enter_context(
                running_app(create_runtime_app(load_node_config(_node(tmp_path, f"rt{i}", *ms))))
            )
            for i, ms in enumerate(nodes)
        ]
        settings = ProxySettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path}/p.db",
            admin_token=ADMIN,
            runtimes=urls,
            status_ttl_s=0.0,  # every call reads the runtimes' drains afresh
            placement_library=str(library),
            **({"placement_interval_s": 3600.0} | placement),  # type: ignore[arg-type]
        )
        yield stack.enter_context(running_proxy(settings)), urls


def _models(url: str) -> list[str]:
    names: list[str] = httpx.get(url + "/v1/runtime/status").json()["model_names"]
    return names


def test_a_library_model_is_cold_started_by_its_first_call(tmp_path: Path) -> None:
    # demand counts the calls of the last window_s clock seconds: at 500x the default 300 s is
    # 0.6 s of wall time, less than a loaded CI machine took between the call and the admin
    # read; the longest window (an hour: 7.2 s) keeps the call in it
    window = {"placement_window_s": 3600.0}
    with _fleet(tmp_path, ("glm-4.5-fp8",), ("glm-4.5-air-fp8",), **window) as (proxy, urls):
        client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
        listed = {m.id: m.model_extra for m in client.models.list()}
        assert sorted(listed) == ["glm-4.5-air-fp8", "glm-4.5-fp8", "gpt-oss-120b", "minimax-m2"]
        assert listed["gpt-oss-120b"]["instances"] == []  # servable: a call starts it
        h200 = load_catalog().server("h200x8")  # the sim nodes' server (their status says it)
        weights = load_catalog().model("gpt-oss-120b").weight_bytes
        assert listed["gpt-oss-120b"]["state"] == "cold"
        assert listed["gpt-oss-120b"]["cold_start_s"] == round(h200.placement_s(weights, False), 1)
        assert (
            listed["glm-4.5-fp8"]["state"] == "warm" and "cold_start_s" not in listed["glm-4.5-fp8"]
        )
        counted = httpx.post(
            proxy.base_url + "/v1/messages/count_tokens",
            json={"model": "gpt-oss-120b", "messages": [{"role": "user", "content": "cold"}]},
        )
        assert counted.status_code == 200, counted.text  # a known model; counting starts none
        assert all("gpt-oss-120b" not in _models(url) for url in urls)
        reply = client.chat.completions.with_raw_response.create(
            model="gpt-oss-120b", messages=[{"role": "user", "content": "cold"}]
        )
        assert reply.parse().model == "gpt-oss-120b"
        hosts = [url for url in urls if "gpt-oss-120b" in _models(url)]
        assert len(hosts) == 1
        assert reply.headers["x-talaria-instance"] in ("rt0", "rt1")
        listed = {m.id: m.model_extra for m in client.models.list()}
        assert [i["instance"] for i in listed["gpt-oss-120b"]["instances"]] == [
            reply.headers["x-talaria-instance"]
        ]
        assert listed["gpt-oss-120b"]["state"] == "warm"

        admin = httpx.get(
            proxy.base_url + "/admin/placement", headers={"authorization": f"Bearer {ADMIN}"}
        ).json()
        [move] = admin["moves"]
        assert (move["kind"], move["model"], move["reason"], move["outcome"]) == (
            "add",
            "gpt-oss-120b",
            "cold-start",
            "ok",
        )
        assert admin["library"] == ["gpt-oss-120b", "minimax-m2"]
        assert admin["demand"] == {"gpt-oss-120b": 1.0}  # as its runtime metered it
        assert admin["call_s"]["gpt-oss-120b"] > 0

        # a model outside the library is still a 404; one whose engine cannot start, a 503
        with pytest.raises(openai.NotFoundError, match="kimi-k2-instruct"):
            client.chat.completions.create(
                model="kimi-k2-instruct", messages=[{"role": "user", "content": "x"}]
            )
        with pytest.raises(openai.InternalServerError) as failed:
            client.chat.completions.create(
                model="minimax-m2", messages=[{"role": "user", "content": "x"}]
            )
        assert failed.value.status_code == 503
        assert "minimax-m2 could not be started" in failed.value.message
        assert "absent" in failed.value.message  # the runtime's reason: no such directory
        assert failed.value.response.headers["retry-after"] == "30"
        assert all("minimax-m2" not in _models(url) for url in urls)


def _wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``condition`` (each poll an HTTP read) until it holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def test_an_idle_library_model_scales_to_zero_stays_listed_and_comes_back(
    tmp_path: Path,
) -> None:
    """Scale to zero, live: the runtimes and the proxy run at 500× (clock seconds), the
    controller looks every 100 s and keeps an idle model at least 1,500 s."""
    fleet = _fleet(
        tmp_path, ("glm-4.5-fp8",), ("glm-4.5-air-fp8",),
        time_scale=500.0, placement_interval_s=100.0, placement_keep_alive_s=1500.0,
    )  # fmt: skip
    with fleet as (proxy, urls):
        client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)

        def ask(model: str, session: str) -> str:
            reply = client.chat.completions.with_raw_response.create(
                model=model,
                messages=[{"role": "user", "content": f"task {session}"}],
                extra_headers={"x-talaria-session-id": session},
            )
            assert reply.parse().model == model
            return reply.headers["x-talaria-instance"]

        def moves() -> list[tuple[str, str, str, str]]:
            admin = httpx.get(
                proxy.base_url + "/admin/placement", headers={"authorization": f"Bearer {ADMIN}"}
            ).json()
            return [(m["kind"], m["model"], m["reason"], m["outcome"]) for m in admin["moves"]]

        def hosted() -> bool:
            return any("gpt-oss-120b" in _models(url) for url in urls)

        def state() -> str:
            listed = {m.id: m.model_extra for m in client.models.list()}
            return str(listed["gpt-oss-120b"]["state"])

        ask("gpt-oss-120b", "first")  # its cold start
        assert hosted() and state() == "warm"
        evicted = ("evict", "gpt-oss-120b", "scale-to-zero", "ok")
        _wait_until(lambda: evicted in moves(), "gpt-oss-120b scaled to zero")
        assert not hosted() and state() == "cold"  # still listed, with its expected cold start
        assert ask("glm-4.5-fp8", "meanwhile") == "rt0"  # the others serve on
        ask("gpt-oss-120b", "second")  # answered after a second cold start
        assert hosted()
        with pytest.raises(openai.InternalServerError) as failed:  # its engine cannot start
            ask("minimax-m2", "broken")
        assert failed.value.status_code == 503 and "could not be started" in failed.value.message
        assert failed.value.response.headers["retry-after"] == "30"
        assert ask("glm-4.5-fp8", "after") == "rt0"  # the node serves the others on
        started = ("add", "gpt-oss-120b", "cold-start", "ok")
        assert moves()[:3] == [started, evicted, started]
        admin = httpx.get(
            proxy.base_url + "/admin/placement", headers={"authorization": f"Bearer {ADMIN}"}
        ).json()
        assert admin["keep_alive_s"] == {"gpt-oss-120b": 1500.0, "minimax-m2": 1500.0}


def test_a_draining_model_keeps_its_sessions_and_takes_no_new_one(tmp_path: Path) -> None:
    with _fleet(tmp_path, ("glm-4.5-fp8", "gpt-oss-120b"), ("glm-4.5-fp8",)) as (proxy, urls):
        client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)

        def call(session: str) -> str:
            reply = client.chat.completions.with_raw_response.create(
                model="glm-4.5-fp8",
                messages=[{"role": "user", "content": f"work of {session}"}],
                extra_headers={"x-talaria-session-id": session},
            )
            return reply.headers["x-talaria-instance"]

        first = call("kept")
        by_name = dict(zip(("rt0", "rt1"), urls, strict=True))
        drained = httpx.post(by_name[first] + "/v1/runtime/models/glm-4.5-fp8/drain")
        assert drained.status_code == 200 and drained.json()["draining_models"] == ["glm-4.5-fp8"]
        other = "rt1" if first == "rt0" else "rt0"
        assert call("kept") == first  # its KV is there: it stays
        assert {call(f"new-{i}") for i in range(4)} == {other}
        missing = httpx.post(by_name[first] + "/v1/runtime/models/kimi-k2-instruct/drain")
        assert missing.status_code == 404
