"""``talaria serve --runtime ... --placement-library`` as real processes: the proxy's
placement controller cold-starts a library model on one of two ``talaria runtime`` processes
for its first call, over HTTP (proxy/placement/loop.py); the flag without runtime servers,
or with a library that does not load, is refused before anything starts."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

from bench.harness.processes import talaria_command, talaria_runtime, talaria_serve

ADMIN = "admin-secret-token-0123"
NODE = """
[node]
name = "{name}"
time_scale = 200

[[model]]
name = "{model}"
engine = "sim"
"""
LIBRARY = """
[[model]]
name = "gpt-oss-120b"
engine = "sim"
"""
POLLS = 600
"""Reads of the runtime's status before a test gives up (each takes milliseconds)."""


def test_the_first_call_of_a_library_model_starts_it_on_a_runtime(tmp_path: Path) -> None:
    library = tmp_path / "library.toml"
    library.write_text(LIBRARY)
    configs = []
    for name, model in (("rt-a", "glm-4.5-fp8"), ("rt-b", "glm-4.5-air-fp8")):
        configs.append(tmp_path / f"{name}.toml")
        configs[-1].write_text(NODE.format(name=name, model=model))
    with talaria_runtime(configs[0]) as a, talaria_runtime(configs[1]) as b:
        args = ["--runtime", a.base_url, "--runtime", b.base_url]
        args += ["--placement-library", str(library)]
        env = {"TALARIA_ADMIN_TOKEN": ADMIN, "TALARIA_TIME_SCALE": "200"}
        with talaria_serve(args, env, tmp_path) as proxy:
            client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0, timeout=120)
            reply = client.chat.completions.with_raw_response.create(
                model="gpt-oss-120b", messages=[{"role": "user", "content": "cold"}]
            )
            assert reply.parse().model == "gpt-oss-120b"
            instance = reply.headers["x-talaria-instance"]
            hosts = {
                status["instance"]
                for url in (a.base_url, b.base_url)
                if "gpt-oss-120b"
                in (status := httpx.get(url + "/v1/runtime/status").json())["model_names"]
            }
            assert hosts == {instance}
            placement = httpx.get(
                proxy.base_url + "/admin/placement", headers={"authorization": f"Bearer {ADMIN}"}
            ).json()
            assert [
                (m["model"], m["runtime"], m["reason"], m["outcome"]) for m in placement["moves"]
            ] == [("gpt-oss-120b", instance, "cold-start", "ok")]


def test_a_drain_left_by_a_gone_replica_is_taken_over_and_the_model_removed(
    tmp_path: Path,
) -> None:
    """A runtime lists a library model as draining that no proxy is carrying out (the replica
    that began the drain has gone: here the drain is asked of the runtime directly); the
    proxy's next look takes the drain over and removes the model, which has no session."""
    library = tmp_path / "library.toml"
    library.write_text(LIBRARY)
    config = tmp_path / "rt-a.toml"
    config.write_text(NODE.format(name="rt-a", model="glm-4.5-fp8") + LIBRARY)
    with talaria_runtime(config) as a:
        drained = httpx.post(a.base_url + "/v1/runtime/models/gpt-oss-120b/drain", timeout=30)
        assert drained.status_code == 200, drained.text
        args = ["--runtime", a.base_url, "--placement-library", str(library)]
        env = {"TALARIA_ADMIN_TOKEN": ADMIN, "TALARIA_TIME_SCALE": "200"}
        with talaria_serve(args, env, tmp_path) as proxy:

            def moves() -> list[tuple[str, str, str, str]]:
                placement = httpx.get(
                    proxy.base_url + "/admin/placement",
                    headers={"authorization": f"Bearer {ADMIN}"},
                ).json()
                return [
                    (m["kind"], m["model"], m["reason"], m["outcome"]) for m in placement["moves"]
                ]

            for _ in range(POLLS):  # looks run on the proxy's timer: 60 clock s, 0.3 s here
                made = moves()
                if made and all(m[3] != "running" for m in made):
                    break
                time.sleep(0.05)
            assert moves() == [("drain", "gpt-oss-120b", "taken-over", "ok")]
            names = httpx.get(a.base_url + "/v1/runtime/status").json()["model_names"]
            assert names == ["glm-4.5-fp8"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--placement-library", "{library}"], "give them with --runtime"),
        (["--runtime", "http://127.0.0.1:9", "--placement-library", "{empty}"], "no [[model]]"),
    ],
)
def test_a_placement_library_without_runtimes_or_entries_is_refused(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "library.toml").write_text(LIBRARY)
    (tmp_path / "empty.toml").write_text("")
    paths = {"library": tmp_path / "library.toml", "empty": tmp_path / "empty.toml"}
    command = [*talaria_command(), "serve", *(a.format(**paths) for a in args)]
    env = {**os.environ, "COLUMNS": "400"}  # the error panel unwrapped, whatever the path
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=env
    )
    assert done.returncode == 2, done.stderr
    assert message in " ".join(done.stderr.split())
