"""GPU groups live (issue 40): two ``talaria runtime`` processes on one 8-GPU server, one on a
group of 2 GPUs (``[node] gpus``), one on 4 (``--gpus``), behind ``talaria serve`` with a
placement library: each reports its group and its share of the node's pinned-weight budget,
and the proxy's placement loop cold-starts a model that needs 4 GPUs on the 4-GPU runtime,
never on the 2-GPU one that would win the tie. A bad group is one clear error at start."""

from __future__ import annotations

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
{gpus}
[[model]]
name = "{model}"
engine = "sim"
"""
LIBRARY = """
[[model]]
name = "minimax-m2"
engine = "sim"
"""
"""230 GB of weights (within the 2-GPU group's 325 GB budget beside gpt-oss-120b's 65 GB),
but 4 GPUs at least: weights and one 196,608-token sequence's KV (core/groups.py)."""


def test_the_placement_loop_puts_a_model_only_on_a_group_that_holds_it(tmp_path: Path) -> None:
    library = tmp_path / "library.toml"
    library.write_text(LIBRARY)
    two, four = tmp_path / "rt-a.toml", tmp_path / "rt-b.toml"
    two.write_text(NODE.format(name="rt-a", model="gpt-oss-120b", gpus='gpus = "4-5"'))
    four.write_text(NODE.format(name="rt-b", model="glm-4.5-air-fp8", gpus=""))
    with (
        talaria_runtime(two) as a,
        talaria_runtime(four, args=("--gpus", "0-3")) as b,
    ):
        statuses = {
            s["instance"]: s
            for s in (httpx.get(r.base_url + "/v1/runtime/status").json() for r in (a, b))
        }
        assert {n: (s["server"], s["gpus"]) for n, s in statuses.items()} == {
            "rt-a": ("h200x8", 2),
            "rt-b": ("h200x8", 4),
        }
        # a quarter and a half of the node's 2 TB: × 0.9, less their share of the 500 GB floor
        assert statuses["rt-a"]["weight_budget_bytes"] == pytest.approx(0.25 * (1.8e12 - 5e11))
        assert statuses["rt-b"]["weight_budget_bytes"] == pytest.approx(0.5 * (1.8e12 - 5e11))
        args = ["--runtime", a.base_url, "--runtime", b.base_url]
        args += ["--placement-library", str(library)]
        env = {"TALARIA_ADMIN_TOKEN": ADMIN, "TALARIA_TIME_SCALE": "200"}
        with talaria_serve(args, env, tmp_path / "data") as proxy:
            client = openai.OpenAI(base_url=proxy.v1, api_key="x", max_retries=0, timeout=120)
            reply = client.chat.completions.with_raw_response.create(
                model="minimax-m2", messages=[{"role": "user", "content": "cold"}]
            )
            assert reply.headers["x-talaria-instance"] == "rt-b"
            names = {
                r: httpx.get(url + "/v1/runtime/status").json()["model_names"]
                for r, url in (("rt-a", a.base_url), ("rt-b", b.base_url))
            }
            assert names == {"rt-a": ["gpt-oss-120b"], "rt-b": ["glm-4.5-air-fp8", "minimax-m2"]}


@pytest.mark.parametrize(
    ("model", "gpus", "message"),
    [
        ("gpt-oss-120b", "0-2", "1, 2, 4 or 8 GPUs, not 3"),
        ("gpt-oss-120b", "6-9", "GPUs [8, 9] are not GPUs of server h200x8"),
        ("gpt-oss-120b", "1,1", "must name distinct devices"),
        ("glm-4.5-fp8", "0-1", "glm-4.5-fp8 does not fit a group of 2 GPUs"),
    ],
)
def test_a_bad_group_is_one_clear_error_at_start(
    tmp_path: Path, model: str, gpus: str, message: str
) -> None:
    config = tmp_path / "node.toml"
    config.write_text(NODE.format(name="rt", model=model, gpus=""))
    command = [*talaria_command(), "runtime", "--config", str(config), "--gpus", gpus]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    said = " ".join(done.stderr.replace("│", " ").split())  # rich boxes and wraps it
    assert message in said, said
