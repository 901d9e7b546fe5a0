"""``talaria serve --upstream URL`` (talaria/cli/upstream.py): the servers' models are read from
their ``/v1/models`` and served through a child runtime of upstream engines; servers of one
model are its replicas, a child runtime each, a session's calls kept on one; a URL that does not
answer, serves nothing or is given twice, and replicas that differ, are one clear error naming
them."""

from __future__ import annotations

import subprocess
import tomllib
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest

from bench.harness.processes import free_port, talaria_command, talaria_serve
from talaria.cli.upstream import Upstream, UpstreamError, discover, node_toml, replica_nodes
from tests.fake_upstream import fake_upstream_thread
from tests.integration.hostile_upstream import HostileUpstream
from tests.support import until

ADMIN = "admin-token-" + "x" * 24


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


def test_servers_of_one_model_are_replicas_unless_they_differ() -> None:
    with (
        fake_upstream_thread(model="m", max_model_len=4096) as one,
        fake_upstream_thread(model="m", max_model_len=4096) as two,
        fake_upstream_thread(model="m", max_model_len=2048) as short,
    ):
        found = discover([one.url, two.url + "/v1/"])
        assert [u.url for u in found] == [one.url + "/v1", two.url + "/v1"]
        assert [u.models for u in found] == [("m",), ("m",)]
        with pytest.raises(UpstreamError, match=f"upstream {one.url}/v1 is given twice"):
            discover([one.url, one.url + "/v1"])
        with pytest.raises(UpstreamError) as differ:
            discover([one.url, short.url])
    assert str(differ.value) == (
        f"model 'm': {one.url}/v1 reports context window 4096 and {short.url}/v1 2048: "
        "replicas of one model must be alike"
    )


@pytest.mark.parametrize(
    ("servers", "nodes"),
    [
        ({"a": ("x",)}, [["a"]]),
        ({"a": ("x",), "b": ("y",)}, [["a", "b"]]),  # no model twice: one node
        ({"a": ("x",), "b": ("x",)}, [["a"], ["b"]]),  # replicas: a node each
        # a server stays whole; the next replica goes to the first node without its model
        ({"a": ("x", "y"), "b": ("x",), "c": ("y",), "d": ("z",)}, [["a", "d"], ["b", "c"]]),
        ({"a": ("x",), "b": ("x",), "c": ("x",), "d": ("y",)}, [["a", "d"], ["b"], ["c"]]),
    ],
)
def test_replica_nodes_put_no_model_twice_on_a_node(
    servers: dict[str, tuple[str, ...]], nodes: list[list[str]]
) -> None:
    found = [Upstream(url, models) for url, models in servers.items()]
    assert [[u.url for u in node] for node in replica_nodes(found)] == nodes


def test_two_replicas_share_the_sessions_and_keep_each_on_one(tmp_path: Path) -> None:
    """Two servers of one model behind ``serve``: a runtime each (``upstream-0``,
    ``upstream-1``); every session's calls stay on one, and the sessions use both. When one
    server stops, only calls sent to it fail (503, ``Retry-After``), and its runtime leaves the
    model out of its status, so its sessions go on on the other replica; when the server is
    back, the runtime's probe finds it and it serves again."""
    admin = {"authorization": f"Bearer {ADMIN}"}
    with fake_upstream_thread(model="m", max_model_len=4096) as one, ExitStack() as second:
        two = second.enter_context(fake_upstream_thread(model="m", max_model_len=4096))
        two.port = int(two.url.rsplit(":", 1)[1])  # to come back on
        args = ["--upstream", one.url, "--upstream", two.url,
                "--database-url", f"sqlite+aiosqlite:///{tmp_path}/p.db"]  # fmt: skip
        with talaria_serve(args, {"TALARIA_ADMIN_TOKEN": ADMIN}, tmp_path) as proxy:
            client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0)
            assert [m.id for m in client.models.list()] == ["m"]
            where: dict[str, set[str]] = {}
            talks = {f"s{i}": [{"role": "user", "content": f"task {i} " * 30}] for i in range(6)}

            def turn(session: str) -> str:
                messages = talks[session]
                reply = client.chat.completions.with_raw_response.create(
                    model="m",
                    messages=messages,  # type: ignore[arg-type]
                    extra_headers={"x-session-id": session},
                )
                text = reply.parse().choices[0].message.content
                assert text == "Hello from m."
                messages += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": "go on"},
                ]
                return reply.headers["x-talaria-instance"]

            for _ in range(3):
                for session in talks:
                    where.setdefault(session, set()).add(turn(session))
            assert all(len(instances) == 1 for instances in where.values()), where
            assert set().union(*where.values()) == {"upstream-0", "upstream-1"}, where
            calls = [sum(c == ("POST", "/v1/chat/completions") for c in f.log) for f in (one, two)]
            assert sum(calls) == 18 and min(calls) > 0

            second.close()  # the second server stops; its runtime stays up
            on_dead = [s for s, i in where.items() if i == {"upstream-1"}]
            failed = []
            for session in talks:
                try:
                    served_by = turn(session)
                except openai.APIStatusError as exc:  # a call that found the server gone
                    assert session in on_dead and exc.status_code == 503
                    assert "retry-after" in exc.response.headers
                    failed.append(session)
                    continue
                assert served_by == "upstream-0"  # the dead replica is left out
            assert failed and all(turn(session) == "upstream-0" for session in failed)

            def residency(instance: str) -> list[str]:
                listed = httpx.get(proxy.base_url + "/admin/instances", headers=admin).json()
                [status] = [i for i in listed["data"] if i["name"] == instance]
                return sorted(status["residency"])

            assert residency("upstream-1") == []
            # the server comes back on its port: the runtime's probe finds it, it serves again
            with fake_upstream_thread(model="m", max_model_len=4096, port=two.port):
                assert until(lambda: residency("upstream-1") == ["m"], seconds=30)


def test_the_node_config_has_one_upstream_model_per_served_model() -> None:
    upstreams = [Upstream("http://a/v1", ("x", "y")), Upstream("http://b/v1", ('q"uote',))]
    config = tomllib.loads(node_toml(upstreams, "vllm", "-co_residency"))
    assert config["node"] == {"name": "upstream", "policy": "-co_residency"}
    assert tomllib.loads(node_toml(upstreams, "vllm", None, "upstream-1"))["node"] == {
        "name": "upstream-1"
    }
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
