"""runtime/factory.py picks engines from the registry of runtime/engine_kinds.py: a toy engine
registered with one line is built into a node from a node config and serves calls through the
``NodeScheduler``, though it implements only the required ``Engine`` members (runtime/engine.py;
the node gives it the optional capabilities' defaults, runtime/scheduling/driven.py); an unknown
engine name is refused with the known ones listed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from talaria.core.calls import ModelOutput
from talaria.core.catalog import load_catalog
from talaria.core.clock import Clock, LoopClock, run_virtual
from talaria.core.types import (
    CallRequest,
    CallResult,
    Finished,
    FirstToken,
    GenerationEvent,
    KvSource,
)
from talaria.runtime.config import ModelConfig, NodeConfig, NodeConfigError, load_node_config
from talaria.runtime.config_fields import ENGINE_FIELDS
from talaria.runtime.engine import CAPABILITIES, Admission, Engine, EngineInfo, call_result
from talaria.runtime.engine_kinds import ENGINES, EngineKind, EngineSite, engine_fields
from talaria.runtime.factory import build_node_from_config

STEP_S = 0.01
"""The toy's time per output token."""


class ToyEngine:
    """An engine of the required members only (``Engine``: no switching, no staging, no memory
    of the node's, no KV to report): it answers ``ok`` after one step per output token."""

    def __init__(self, model: str, clock: Clock, node: str) -> None:
        self.model = model
        self._clock = clock
        self._node = node
        self._running = 0
        self.busy_s = 0.0

    @classmethod
    def build(cls, site: EngineSite) -> Engine:
        """The registry's builder: one toy engine for the config's model."""
        return cls(site.model.name, site.clock, site.config.name)

    async def start(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None

    @property
    def running(self) -> int:
        return self._running

    def estimate_service_s(self, request: CallRequest, expected_output_tokens: int) -> float:
        return expected_output_tokens * STEP_S

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        return STEP_S

    def try_admit(
        self, request: CallRequest, arrival_s: float, sp_admitted: bool
    ) -> Admission | None:
        self._running += 1
        now = self._clock.now()
        return Admission(request, arrival_s, now, sp_admitted, KvSource.NEW, 0)

    async def run(self, admission: Admission) -> AsyncIterator[GenerationEvent]:
        tokens = admission.request.max_output_tokens
        start = self._clock.now()
        await self._clock.sleep(STEP_S)
        first = self._clock.now()
        yield FirstToken(first, 0, KvSource.NEW)
        await self._clock.sleep(STEP_S * (tokens - 1))
        self._running -= 1
        self.busy_s += self._clock.now() - start
        yield Finished(
            call_result(
                admission,
                self._node,
                output_tokens=tokens,
                first_token_s=first,
                finished_s=self._clock.now(),
                output=ModelOutput("ok"),
            )
        )

    def info(self) -> EngineInfo:
        return EngineInfo("toy", False, 16, None, 4096)


def test_a_registered_toy_engine_serves_a_call_through_the_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(ENGINES, "toy", EngineKind(ToyEngine.build, uses_node_memory=False))
    config = NodeConfig("toy-node", (ModelConfig("toy-model", "toy"),))

    async def main() -> CallResult:
        built = build_node_from_config(config, load_catalog(), LoopClock())
        assert isinstance(built.engines["toy-model"], ToyEngine)
        built.node.start()
        try:
            return await built.node.submit(CallRequest("r1", "s1", "toy-model", 10, 5))
        finally:
            await built.node.stop()

    result = run_virtual(main())
    assert result.node == "toy-node" and result.model == "toy-model"
    assert result.output == ModelOutput("ok") and result.output_tokens == 5
    assert result.finished_s - result.admitted_s == pytest.approx(5 * STEP_S)


def test_the_required_engine_is_small_and_the_toy_has_no_capability() -> None:
    """``Engine`` asks at most 12 members; the toy implements those and none of the optional
    capabilities, so nothing in it answers a question it has no answer to."""
    members = {n for n in vars(Engine) if not n.startswith("_")} | set(Engine.__annotations__)
    assert len(members) <= 12, sorted(members)
    toy = ToyEngine("m", LoopClock(), "n")
    assert [c.__name__ for c in CAPABILITIES if isinstance(toy, c)] == []
    assert not any(hasattr(toy, m) for m in ("active", "activate", "needed_bytes", "staging"))


@pytest.mark.parametrize("policy", ["round", "talaria"])
def test_toy_engines_take_turns_behind_the_nodes_gate(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two toy models on one node, calls for both at once: under ``round`` (one model in at a
    time) the node's gate switches between them, at no cost; under ``talaria`` both stay in
    (they hold nothing co-residency must fit). Every call is served either way."""
    monkeypatch.setitem(ENGINES, "toy", EngineKind(ToyEngine.build, uses_node_memory=False))
    models = (ModelConfig("toy-a", "toy"), ModelConfig("toy-b", "toy"))
    config = NodeConfig("toy-node", models, policy=policy)

    async def main() -> tuple[list[CallResult], int]:
        built = build_node_from_config(config, load_catalog(), LoopClock())
        built.node.start()
        try:
            calls = [
                built.node.submit(CallRequest(f"r{i}", f"s{i}", f"toy-{'ab'[i % 2]}", 10, 5))
                for i in range(6)
            ]
            results = await asyncio.gather(*calls)
            return results, len(built.node.slots)
        finally:
            await built.node.stop()

    results, slots = run_virtual(main())
    assert sorted(r.request_id for r in results) == [f"r{i}" for i in range(6)]
    assert all(r.output == ModelOutput("ok") for r in results)
    assert {r.model for r in results} == {"toy-a", "toy-b"}
    served = {
        m: (
            min(r.admitted_s for r in results if r.model == m),
            max(r.finished_s for r in results if r.model == m),
        )
        for m in ("toy-a", "toy-b")
    }
    (a_in, a_out), (b_in, b_out) = served["toy-a"], served["toy-b"]
    if policy == "round":  # one model in at a time: a slot each, served one after the other
        assert slots >= 2 and (a_out <= b_in or b_out <= a_in)
    else:  # both in at once
        assert slots == 1 and a_in == b_in == 0.0


KNOWN = r"unknown engine 'nope'; known engines: sim, vllm, openai"


def test_an_unknown_engine_names_the_known_ones(tmp_path: Path) -> None:
    config = NodeConfig("n", (ModelConfig("m", "nope"),))
    with pytest.raises(NodeConfigError, match=KNOWN):
        build_node_from_config(config, load_catalog(), LoopClock())
    file = tmp_path / "node.toml"
    file.write_text('[[model]]\nname = "m"\nengine = "nope"\n')
    with pytest.raises(NodeConfigError, match=KNOWN):
        load_node_config(file)


def test_the_config_and_the_registry_name_the_same_engines() -> None:
    """runtime/config.py checks a node TOML's engine names and options against
    ``ENGINE_FIELDS`` without importing the registry (runtime/engine_kinds.py); the registry
    builds each of them."""
    assert engine_fields() == dict(ENGINE_FIELDS)
    assert list(ENGINES) == list(ENGINE_FIELDS)
