"""NVIDIA's aiperf, a client nobody here wrote, replays coding-agent sessions against the stage's
``talaria serve --model smollm2=DIR`` (vLLM's CPU build): the sessions of its ``synthesize
agentic-code`` generator (bench/aiperf/agentic-small.json: the generator's shape, scaled to a
135M model on 2 cores), sent with nothing but what aiperf sends by itself (its
``x-session-affinity`` header, the whole conversation each turn), on chat completions and on
Anthropic Messages. Each session aiperf sends must come out as one Talaria session holding
every one of its calls, none failed, and its continuations must find their prefix cached.
bench/aiperf_live.py runs the same at more sessions and concurrencies (docs/results.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.harness.aiperf import Aiperf, aiperf_binary, matched, requests, talaria_sessions
from bench.harness.processes import ServeProcess
from tests.real.servers import ADMIN, NAME
from tests.support import unavailable

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def aiperf(tmp_path_factory: pytest.TempPathFactory) -> Aiperf:
    binary = aiperf_binary()
    if binary is None:
        unavailable("no aiperf: bash scripts/aiperf-venv.sh (or set TALARIA_AIPERF)")
    return Aiperf(binary, tmp_path_factory.mktemp("aiperf"))


@pytest.mark.parametrize(("endpoint", "seed"), [("chat", 3), ("messages", 4)])
def test_every_aiperf_session_is_one_talaria_session(
    served: ServeProcess, real_dir: Path, aiperf: Aiperf, endpoint: str, seed: int
) -> None:
    dataset = aiperf.synthesize(sessions=3, seed=seed)
    tokenizer = aiperf.tokenizer(real_dir)
    art = aiperf.profile(
        served.base_url, NAME, tokenizer, dataset, f"{endpoint}-{seed}", endpoint, concurrency=2
    )
    sent = requests(art)
    assert len(sent) >= 9, sent  # three sessions of at least three turns each
    assert [r for r in sent if r.error] == []
    stored = talaria_sessions(served.base_url, ADMIN)
    found = matched(sent, stored)
    assert found and all(m.whole for m in found.values()), found
    mine = [s for s in stored if s["session_id"] in found]
    assert {s["identity_source"] for s in mine} == {"x-session-affinity"}
    # every continuation repeats its session's whole previous prompt: most of the tokens of
    # the calls after the first are found cached (the first calls share aiperf's system layer)
    prompt = sum(s["prompt_tokens"] for s in mine)
    cached = sum(s["cached_tokens"] for s in mine)
    assert cached / prompt > 0.5, (cached, prompt)
