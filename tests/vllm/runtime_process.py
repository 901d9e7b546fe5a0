"""``talaria runtime`` as a real process, for the vLLM tests: the harness's
(bench/harness/processes.py ``talaria_runtime``), offline, with vLLM's CPU KV pool at 1 GiB."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.harness.processes import talaria_runtime

VLLM_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


@contextmanager
def running_runtime(
    config: Path, start_timeout_s: float = 600, args: tuple[str, ...] = ()
) -> Iterator[str]:
    """Start the runtime on ``config`` (and ``args``); yield its URL once it listens, waiting
    up to ``start_timeout_s`` between two lines of its log (its engines start one at a time,
    ~20 s each, with silent stretches); stop it at the end. vLLM's log (its standard output)
    goes to the test's, which pytest shows when a test fails."""
    with talaria_runtime(config, VLLM_ENV, args, start_timeout_s, stdout=None) as runtime:
        yield runtime.base_url
