"""``talaria serve --runtime ... --placement-library`` as real processes: the proxy's
placement controller cold-starts a library model on one of two ``talaria runtime`` processes
for its first call, over HTTP (proxy/placement_loop.py); the flag without runtime servers,
or with a library that does not load, is refused before anything starts."""

from __future__ import annotations

import os
import subprocess
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
