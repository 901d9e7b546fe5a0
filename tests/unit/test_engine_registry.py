"""runtime/factory.py picks engines from its registry: a toy engine registered with one line is
built into a node from a node config and serves a call through the ``NodeScheduler``; an
unknown engine name is refused with the known ones listed."""

from __future__ import annotations

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
from talaria.runtime import factory
from talaria.runtime.config import ModelConfig, NodeConfig, NodeConfigError, load_node_config
from talaria.runtime.config_fields import ENGINE_FIELDS
from talaria.runtime.engine import Admission, Engine, EngineInfo, EngineSnapshot, call_result
from talaria.runtime.factory import EngineKind, EngineSite, build_node_from_config

STEP_S = 0.01
"""The toy's time per output token."""


class ToyEngine:
    """An engine that answers ``ok`` after one step per output token; no memory to manage."""

    def __init__(self, model: str, clock: Clock, node: str) -> None:
        self.model = model
        self._clock = clock
        self._node = node
        self._active = False
        self._running = 0

    @classmethod
    def build(cls, site: EngineSite) -> Engine:
        """The registry's builder: one toy engine for the config's model."""
        return cls(site.model.name, site.clock, site.config.name)

    async def start(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None

    @property
    def active(self) -> bool:
        return self._active

    @property
    def running(self) -> int:
        return self._running

    def estimate_service_s(self, request: CallRequest, expected_output_tokens: int) -> float:
        return expected_output_tokens * STEP_S

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        return STEP_S

    def kv_bytes(self, tokens: int) -> float:
        return 0.0

    @property
    def weight_bytes(self) -> float:
        return 0.0

    def kv_floor_bytes(self) -> float:
        return 0.0

    def can_activate(self) -> bool:
        return True

    def switch_in_s(self) -> float:
        return 0.0

    def kv_restore_s(self, tokens: int) -> float:
        return 0.0

    def recompute_s(self, tokens: int) -> float:
        return 0.0

    def needed_bytes(self, request: CallRequest) -> float:
        return 0.0

    def try_admit(
        self, request: CallRequest, arrival_s: float, sp_admitted: bool
    ) -> Admission | None:
        self._running += 1
        now = self._clock.now()
        return Admission(request, arrival_s, now, sp_admitted, KvSource.NEW, 0)

    async def run(self, admission: Admission) -> AsyncIterator[GenerationEvent]:
        tokens = admission.request.max_output_tokens
        await self._clock.sleep(STEP_S)
        first = self._clock.now()
        yield FirstToken(first, 0, KvSource.NEW)
        await self._clock.sleep(STEP_S * (tokens - 1))
        self._running -= 1
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

    async def activate(self) -> float:
        self._active = True
        return 0.0

    async def deactivate(self, keep_kv_on_host: bool, keep_host_weight_copy: bool) -> float:
        self._active = False
        return 0.0

    def start_staging(self) -> bool:
        return False

    @property
    def staging(self) -> bool:
        return False

    def cancel_staging(self) -> None:
        return None

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot(self.model, self._active, self._running, 0.0, 0.0)

    def info(self) -> EngineInfo:
        return EngineInfo("toy", False, 16, None, 4096)

    def session_kv(self) -> dict[str, tuple[int, KvSource]]:
        return {}


def test_a_registered_toy_engine_serves_a_call_through_the_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(factory.ENGINES, "toy", EngineKind(ToyEngine.build, uses_node_memory=False))
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


KNOWN = r"unknown engine 'nope'; known engines: sim, vllm, openai"


def test_an_unknown_engine_names_the_known_ones(tmp_path: Path) -> None:
    config = NodeConfig("n", (ModelConfig("m", "nope"),))
    with pytest.raises(NodeConfigError, match=KNOWN):
        build_node_from_config(config, load_catalog(), LoopClock())
    file = tmp_path / "node.toml"
    file.write_text('[[model]]\nname = "m"\nengine = "nope"\n')
    with pytest.raises(NodeConfigError, match=KNOWN):
        load_node_config(file)


def test_the_config_and_the_factory_name_the_same_engines() -> None:
    """runtime/config.py checks a node TOML's engine names and options against
    ``ENGINE_FIELDS`` without importing the factory; the factory builds each of them."""
    assert factory.engine_fields() == dict(ENGINE_FIELDS)
    assert list(factory.ENGINES) == list(ENGINE_FIELDS)
