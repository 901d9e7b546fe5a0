"""``talaria serve`` and ``talaria runtime`` as real processes with a runtime token: the proxy
with the runtime's ``TALARIA_RUNTIME_TOKEN`` serves calls and cold-starts a library model on
it, while the runtime refuses anyone without the token; a proxy with no token or another one
stops at start with one clear error; ``talaria serve --model``'s child runtime takes the token
it is given."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from bench.harness.processes import talaria_command, talaria_runtime, talaria_serve
from talaria.cli.supervised import SupervisedRuntime

TOKEN = "e2e-runtime-token-0123456789abcdef"
ADMIN = "admin-secret-token-0123"
NODE = """
[node]
name = "rt-private"
time_scale = 200

[[model]]
name = "glm-4.5-fp8"
engine = "sim"
"""
LIBRARY = """
[[model]]
name = "gpt-oss-120b"
engine = "sim"
"""


def _node(tmp_path: Path) -> Path:
    config = tmp_path / "node.toml"
    config.write_text(NODE)
    return config


def test_a_proxy_with_the_token_serves_over_a_private_runtime(tmp_path: Path) -> None:
    library = tmp_path / "library.toml"
    library.write_text(LIBRARY)
    secret = {"TALARIA_RUNTIME_TOKEN": TOKEN}
    with talaria_runtime(_node(tmp_path), env=secret) as runtime:
        status = runtime.base_url + "/v1/runtime/status"
        assert httpx.get(status).status_code == 401
        assert httpx.get(runtime.base_url + "/readyz").status_code == 200
        args = ["--runtime", runtime.base_url, "--placement-library", str(library)]
        env = {**secret, "TALARIA_ADMIN_TOKEN": ADMIN, "TALARIA_TIME_SCALE": "200"}
        with talaria_serve(args, env, tmp_path) as proxy:
            client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0, timeout=120)
            for model in ("glm-4.5-fp8", "gpt-oss-120b"):  # the second: a cold start
                reply = client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": "private"}],
                    extra_headers={"x-talaria-session-id": f"s-{model}"},
                )
                assert reply.model == model and reply.usage is not None
                assert reply.usage.completion_tokens > 0
            placement = httpx.get(
                proxy.base_url + "/admin/placement", headers={"authorization": f"Bearer {ADMIN}"}
            ).json()
            assert [(m["model"], m["outcome"]) for m in placement["moves"]] == [
                ("gpt-oss-120b", "ok")
            ]
        authorized = httpx.get(status, headers={"authorization": f"Bearer {TOKEN}"})
        assert authorized.json()["model_names"] == ["glm-4.5-fp8", "gpt-oss-120b"]
    assert all(TOKEN not in line for line in runtime.output + proxy.output)


@pytest.mark.parametrize(
    ("proxy_token", "said"),
    [(None, "sent no token"), ("another-token-0123456789abcdef", "a token it does not accept")],
)
def test_a_refused_token_stops_the_proxy_at_start(
    tmp_path: Path, proxy_token: str | None, said: str
) -> None:
    with talaria_runtime(_node(tmp_path), env={"TALARIA_RUNTIME_TOKEN": TOKEN}) as runtime:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TALARIA_")}
        env |= {"TALARIA_DATA_DIR": str(tmp_path), "COLUMNS": "400"}
        if proxy_token:
            env["TALARIA_RUNTIME_TOKEN"] = proxy_token
        command = [*talaria_command(), "serve", "--port", "0", "--runtime", runtime.base_url]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, env=env
        )
    assert done.returncode != 0
    error = f"runtime {runtime.base_url} refused the runtime token (TALARIA_RUNTIME_TOKEN)"
    assert error in done.stderr and said in done.stderr
    assert "not reachable" not in done.stderr  # no retries meant for a runtime still starting
    assert TOKEN not in done.stderr and (proxy_token or TOKEN) not in done.stderr


def test_the_supervised_runtime_takes_the_token_it_is_given(tmp_path: Path) -> None:
    """``talaria serve --model``'s child (cli/supervised.py), on a node of simulated engines."""
    child = SupervisedRuntime(["--config", str(_node(tmp_path))], 5.0, token=TOKEN)
    try:
        child.start(ready_timeout_s=120)  # ready: its /readyz, which needs no token
        status = child.url + "/v1/runtime/status"
        assert httpx.get(status).status_code == 401
        authorized = httpx.get(status, headers={"authorization": f"Bearer {TOKEN}"})
        assert authorized.status_code == 200 and authorized.json()["instance"] == "rt-private"
    finally:
        child.stop()
