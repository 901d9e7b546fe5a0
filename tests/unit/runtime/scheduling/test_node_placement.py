"""NodeScheduler.add_model / retire: a node gains and loses models while it serves (placement)."""

from __future__ import annotations

import asyncio

import pytest

from talaria.core.catalog import load_catalog
from talaria.core.clock import LoopClock, run_virtual
from talaria.core.types import CallRequest
from talaria.runtime.scheduling.calls import UnknownModelError
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import TALARIA
from talaria.runtime.sim_node import NodeSetup, add_sim_model, build_sim_node

CATALOG = load_catalog()
SETUP = NodeSetup("h200x8", "default", ("glm-4.5-fp8",))


def _call(model: str, i: int, output: int = 200) -> CallRequest:
    return CallRequest(
        request_id=f"r{i}",
        session_key=f"s{i}",
        model=model,
        prompt_tokens=4_000,
        max_output_tokens=output,
        output_tokens=output,
        session_final=True,
    )


def test_an_added_model_serves_and_a_retired_one_waits_for_its_calls_then_leaves() -> None:
    added = "gpt-oss-120b"
    weights = CATALOG.model(added).weight_bytes

    async def main() -> dict[str, float]:
        clock = LoopClock()
        node = build_sim_node("n0", SETUP, CATALOG, TALARIA, SchedulerConfig(), clock)
        node.start()
        host_before = node.memory.host_kv_capacity_bytes
        add_sim_model(node, SETUP, added, CATALOG)
        host_added = node.memory.host_kv_capacity_bytes
        first = await node.submit(_call(added, 0))
        running = asyncio.ensure_future(node.submit(_call(added, 1, output=2_000)))
        await clock.sleep(1.0)
        assert node.engines[added].running == 1
        await node.retire(added, weights)
        retired_at = clock.now()
        second = running.result()  # retire waited for it
        with pytest.raises(UnknownModelError):
            await node.submit(_call(added, 2))
        glm = await node.submit(_call("glm-4.5-fp8", 3))  # the other model still serves
        await node.stop()
        return {
            "host_before": host_before,
            "host_added": host_added,
            "host_after": node.memory.host_kv_capacity_bytes,
            "first_out": first.output_tokens,
            "second_finished": second.finished_s,
            "retired_at": retired_at,
            "hbm_weights": sum(node.memory.weights.values()),
            "glm_weights": CATALOG.model("glm-4.5-fp8").weight_bytes,
            "glm_out": glm.output_tokens,
            "models": len(node.engines),
        }

    out = run_virtual(main())
    assert out["host_added"] == pytest.approx(out["host_before"] - weights)
    assert out["host_after"] == pytest.approx(out["host_before"])
    assert out["first_out"] == 200 and out["glm_out"] == 200
    assert out["second_finished"] <= out["retired_at"]
    assert out["hbm_weights"] == pytest.approx(out["glm_weights"])  # the retired one's are gone
    assert out["models"] == 1


def test_adding_a_hosted_model_again_is_refused() -> None:
    async def main() -> None:
        node = build_sim_node("n0", SETUP, CATALOG, TALARIA, SchedulerConfig(), LoopClock())
        with pytest.raises(ValueError, match="already hosts"):
            add_sim_model(node, SETUP, "glm-4.5-fp8", CATALOG)

    run_virtual(main())
