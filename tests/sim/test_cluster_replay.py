"""The cluster replay: a router picks the node of every call (sim/cluster.py, sim/policies.py).

A small cluster of the shipped models (2 nodes, 3 models, 8 sessions) under every cluster
policy, the preset's layout, and one hand-built scenario on a tiny catalog where the talaria
router must bring a continuation back to the node holding its KV.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

from talaria.core.catalog import Catalog, load_catalog
from talaria.core.clock import LoopClock, run_virtual
from talaria.core.efficiency_profile import EfficiencyProfile
from talaria.core.model_spec import ModelSpec
from talaria.core.server_spec import ServerSpec
from talaria.core.trace import SessionTrace
from talaria.core.types import CallRequest, CallResult, KvSource
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import ROUND, TALARIA
from talaria.sim.cluster import Dispatcher
from talaria.sim.experiment import ExperimentSetup, run_experiment
from talaria.sim.policies import CLUSTER_POLICIES, resolve_policy
from talaria.sim.presets import get_preset
from talaria.sim.replay import NodeSetup, build_node
from talaria.sim.workload import WorkloadSpec, generate_sessions

CATALOG = load_catalog()
MODELS = ("gpt-oss-120b", "llama-4-scout-bf16", "glm-4.5-fp8")
SMALL = ExperimentSetup(
    "h200x8",
    "default",
    MODELS,
    nodes=2,
    node_models=(MODELS, MODELS[1:] + MODELS[:1]),
)
SPEC = WorkloadSpec(sessions=8, models=MODELS, total_calls=64, mean_interarrival_s=2.0)


def _sessions(seed: int = 0) -> list[SessionTrace]:
    windows = {m: CATALOG.model(m).context_window_tokens for m in MODELS}
    reasoning = {m: CATALOG.model(m).reasoning for m in MODELS}
    return generate_sessions(SPEC, windows, reasoning, seed)


@pytest.fixture(scope="module")
def small_doc() -> dict[str, Any]:
    return run_experiment(_sessions(), CATALOG, SMALL, CLUSTER_POLICIES)


def test_policies_map_to_router_and_flags() -> None:
    assert (resolve_policy("round").router, resolve_policy("round").flags) == ("load-only", ROUND)
    assert (resolve_policy("talaria").router, resolve_policy("talaria").flags) == (
        "talaria",
        TALARIA,
    )
    for router in ("load-only", "sticky", "kv-aware"):
        assert resolve_policy(router) == resolve_policy(router).__class__(router, router, TALARIA)
    plus = resolve_policy("+sp_admission")
    assert plus.router == "talaria" and plus.flags == replace(ROUND, sp_admission=True)
    with pytest.raises(ValueError, match=r"unknown policy 'fastest'.*kv-aware"):
        resolve_policy("fastest")


def test_every_cluster_policy_completes_every_call_and_records_reasons(
    small_doc: dict[str, Any],
) -> None:
    calls = small_doc["calls"]
    assert calls == 64 and set(small_doc["policies"]) == set(CLUSTER_POLICIES)
    for name, summary in small_doc["policies"].items():
        assert summary["calls_completed"] == calls, name
        assert summary["router"] == resolve_policy(name).router
        assert sum(summary["routing_reasons"].values()) == calls
    reasons = {n: set(s["routing_reasons"]) for n, s in small_doc["policies"].items()}
    assert "reserved" in reasons["talaria"]
    assert "sticky" in reasons["sticky"]
    assert reasons["round"] <= {"least-loaded", "tie-break", "only-candidate"}
    assert reasons["load-only"] <= {"least-loaded", "tie-break", "only-candidate"}
    assert small_doc["policies"]["sticky"]["migrations"] == 0
    dedicated = small_doc["dedicated"]
    assert dedicated["routing_reasons"] == {"only-candidate": calls}


def test_cluster_document_is_deterministic(small_doc: dict[str, Any]) -> None:
    again = run_experiment(_sessions(), CATALOG, SMALL, CLUSTER_POLICIES)
    assert json.dumps(again, sort_keys=True) == json.dumps(small_doc, sort_keys=True)


def test_cluster_preset_layout() -> None:
    preset = get_preset("cluster")
    setup = preset.experiment_setup(nodes=7)  # its own layout wins over --nodes
    assert setup.nodes == 4 and len(setup.layout()) == 4
    assert preset.workload.sessions == 120 and preset.workload.mean_interarrival_s == 3.0
    assert preset.policies == CLUSTER_POLICIES
    server = CATALOG.server(preset.server)
    for model in preset.workload.models:
        hosts = [n for n, s in setup.layout() if model in s.models]
        assert len(hosts) == 2, model
        assert CATALOG.model(model).weight_bytes < server.usable_hbm_bytes
    for _, node in setup.layout():
        pinned = sum(CATALOG.model(m).weight_bytes for m in node.models)
        assert pinned < 0.9 * server.host_dram_bytes
    assert get_preset("paper").experiment_setup(nodes=2).nodes == 2
    with pytest.raises(ValueError, match="must be exactly"):
        replace(SMALL, node_models=(MODELS[:1], MODELS[:1]))


# -- scenario: KV locality brings a continuation home ----------------------------------------
def _tiny_model(name: str) -> ModelSpec:
    return ModelSpec(
        name=name,
        hf_id=f"test/{name}",
        total_params=20e9,
        active_params=20e9,
        layers=50,
        q_heads=50,
        kv_heads=50,
        head_dim=100,
        weight_dtype="bf16",
        weight_bytes=40e9,
        kv_bytes_per_token=1_000_000,
        kv_bytes_per_token_tp8=1_000_000,
        context_window_tokens=131_072,
    )


TINY = Catalog(
    models={"a": _tiny_model("a"), "b": _tiny_model("b")},
    servers={
        "tiny": ServerSpec(
            name="tiny",
            gpus=1,
            hbm_bytes_per_gpu=100e9,
            hbm_bytes_per_s_per_gpu=1e12,
            dense_flops_per_s_per_gpu={"bf16": 1e15, "fp8": 2e15},
            pcie_peak_bytes_per_s_per_gpu=10e9,
            pcie_pinned_bytes_per_s_per_gpu=10e9,
            nvlink_bytes_per_s_per_gpu=100e9,
            host_dram_bytes=1e12,
            weight_wake_bytes_per_s_per_gpu=10e9,
            weight_sleep_bytes_per_s_per_gpu=20e9,
            gpu_memory_utilization=1.0,
        )
    },
    profiles={
        "tiny": EfficiencyProfile(
            name="tiny", compute_efficiency=1.0, memory_efficiency=1.0, step_overhead_s=0.01
        )
    },
)


def _call(session: str, index: int, prompt: int, output: int, shared: int) -> CallRequest:
    return CallRequest(
        request_id=f"{session}/{index}",
        session_key=session,
        model="a",
        prompt_tokens=prompt,
        max_output_tokens=output,
        call_index=index,
        shared_prefix_tokens=shared,
    )


def test_talaria_brings_a_continuation_back_to_its_kv_on_an_active_model() -> None:
    """Session s runs call 0 on some node X; its tool gap (60 s) outlives the proxy-level
    reservation (expires after 6.4 s), so call 1 is scored. By then X is the busier node (a
    long call of another session runs there) and the other node Y is idle, but X holds s's KV
    in HBM with model a active: talaria returns to X (reason kv-hbm) and reuses the prefix;
    load-only goes to the idle Y and recomputes it."""

    async def scenario(router: str) -> tuple[CallResult, CallResult, str, Dispatcher]:
        clock = LoopClock()
        setup = NodeSetup("tiny", "tiny", ("a", "b"))
        config = SchedulerConfig(quantum_s=30.0)
        nodes = [build_node(n, setup, TINY, TALARIA, config, clock) for n in ("n0", "n1")]
        for node in nodes:
            node.start()
        proxy = Dispatcher(nodes, router, clock, seed=3)
        first = await proxy.call(_call("s", 0, 1000, 10, 0))
        home = next(n for n in nodes if n.name == first.node)
        # another session's long call lands on X directly (bypassing the router)
        busy = asyncio.get_running_loop().create_task(home.submit(_call("busy", 0, 2000, 5000, 0)))
        await clock.sleep(60.0)
        assert home.status().running_calls == 1
        second = await proxy.call(_call("s", 1, 1100, 10, 1010))
        await busy
        for node in nodes:
            await node.stop()
        return first, second, home.name, proxy

    first, second, home, proxy = run_virtual(scenario("talaria"))
    assert first.node == second.node == home
    assert second.kv_source is KvSource.HBM and second.cached_tokens == 1008
    assert proxy.reasons == {"tie-break": 1, "kv-hbm": 1}

    first, second, home, proxy = run_virtual(scenario("load-only"))
    assert first.node == home != second.node and second.kv_source is KvSource.RECOMPUTE
    assert proxy.reasons == {"tie-break": 1, "least-loaded": 1} and proxy.migrations == 1


def test_talaria_reserved_rule_within_the_gap() -> None:
    """Back within the reservation (1 s < 6.4 s): routed by the ``reserved`` rule."""

    async def scenario() -> Dispatcher:
        clock = LoopClock()
        setup = NodeSetup("tiny", "tiny", ("a", "b"))
        nodes = [
            build_node(n, setup, TINY, TALARIA, SchedulerConfig(), clock) for n in ("n0", "n1")
        ]
        for node in nodes:
            node.start()
        proxy = Dispatcher(nodes, "talaria", clock, seed=0)
        first = await proxy.call(_call("s", 0, 1000, 10, 0))
        await clock.sleep(1.0)
        second = await proxy.call(replace(_call("s", 1, 1100, 10, 1010), session_final=True))
        assert second.node == first.node
        for node in nodes:
            await node.stop()
        return proxy

    proxy = run_virtual(scenario())
    assert proxy.reasons == {"tie-break": 1, "reserved": 1}
    assert "s" not in proxy.book  # the final call forgets the session
