"""``talaria serve --upstream URL`` (talaria/cli/upstream.py): the servers' models are read from
their ``/v1/models`` and served through a child runtime of upstream engines; a URL that does not
answer, serves nothing, or repeats another's model is one clear error naming it."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import openai
import pytest

from bench.harness.processes import free_port, talaria_command, talaria_serve
from talaria.cli.upstream import Upstream, UpstreamError, discover, node_toml
from tests.fake_upstream import fake_upstream_thread
from tests.integration.hostile_upstream import HostileUpstream


def test_serve_fronts_a_running_server_with_its_own_models(tmp_path: Path) -> None:
    with fake_upstream_thread(model="served-by-them", max_model_len=4096) as fake:
        args = ["--upstream", fake.url, "--database-url", f"sqlite+aiosqlite:///{tmp_path}/p.db"]
        with talaria_serve(args, {}, tmp_path) as proxy:
            client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
            assert [m.id for m in client.models.list()] == ["served-by-them"]
            reply = client.chat.completions.create(
                model="served-by-them",
                messages=[{"role": "user", "content": "hello " * 30}],
                extra_headers={"x-session-id": "up-1"},
            )
            assert reply.choices[0].message.content == "Hello from served-by-them."
    assert ("POST", "/v1/chat/completions") in fake.log


def test_a_server_that_does_not_answer_is_named_and_nothing_starts(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    done = subprocess.run(
        [*talaria_command(), "serve", "--upstream", dead, "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        env={"TALARIA_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "COLUMNS": "400"},
    )
    assert done.returncode == 2
    assert dead in done.stderr and "did not list its models" in done.stderr


def test_discovery_refuses_empty_and_duplicate_servers() -> None:
    with fake_upstream_thread(model="m") as one, fake_upstream_thread(model="m") as two:
        with pytest.raises(UpstreamError, match="served by"):
            discover([one.url, two.url + "/v1/"])
        (found,) = discover([one.url + "/"])
        assert found == Upstream(one.url.rstrip("/") + "/v1", ("m",))


def test_the_node_config_has_one_upstream_model_per_served_model() -> None:
    upstreams = [Upstream("http://a/v1", ("x", "y")), Upstream("http://b/v1", ('q"uote',))]
    config = tomllib.loads(node_toml(upstreams, "vllm", "-co_residency"))
    assert config["node"] == {"name": "upstream", "policy": "-co_residency"}
    assert [(m["name"], m["url"], m["engine"], m["sleep"]) for m in config["model"]] == [
        ("x", "http://a/v1", "openai", "vllm"),
        ("y", "http://a/v1", "openai", "vllm"),
        ('q"uote', "http://b/v1", "openai", "vllm"),
    ]
    with pytest.raises(UpstreamError, match="sleep must be one of"):
        node_toml(upstreams, "deep", None)


def test_discovery_reads_a_bounded_model_list() -> None:
    """An endless ``/v1/models`` stops ``serve`` with one error at 1 MiB, not a hang or its
    memory (tests/integration/hostile_upstream.py)."""
    with fake_upstream_thread(HostileUpstream) as hostile:
        with pytest.raises(UpstreamError, match="passed 1048576 bytes"):
            discover([hostile.url + "/endless"])
        with pytest.raises(UpstreamError) as leak:
            discover([hostile.url + "/leak"])
    assert "SECRET" not in str(leak.value)
