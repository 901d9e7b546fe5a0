"""Request-level instances (flags.py ``serverless_instances``, the named policy ``serverless``):
the model whose call has waited longest gets the node, admits every call of it, and keeps the
GPUs until it has had no call for the keep-alive, however long others wait."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from talaria.core.types import CallResult, KvSource
from talaria.runtime.scheduling.admission import AdmitReason, decide_admission
from talaria.runtime.scheduling.flags import policy_flags
from talaria.runtime.scheduling.policies.compose import PolicyChoice
from talaria.runtime.scheduling.policies.planner import SERVERLESS_KEEP_ALIVE_S
from talaria.runtime.scheduling.state import CloseReason
from tests.unit.runtime.scheduling.scenarios import (
    COST_A,
    COST_B,
    GAP,
    ONE_CALL_B,
    OUT,
    P0,
    TWO_CALLS_A,
    Agent,
    Call,
    approx,
    lone_call_s,
    ok,
    plain_switch_s,
    run_scenario,
)


def test_serverless_composes_keep_alive_slots_and_instance_admission() -> None:
    choice = PolicyChoice.of(policy_flags("serverless"))
    assert (choice.planner, choice.instances, choice.session_prefill) == ("keep-alive", True, False)
    assert (choice.kv_on_host, choice.stage_weights, choice.holds) == (False, False, "none")
    decision = decide_admission(
        sp_admission=False, closing=False, in_slot_batch=False, contended=True,
        is_continuation=False, remaining_s=0.0, estimate_service_s=lambda: 1e9,
        instances=True,
    )  # fmt: skip
    assert decision.admit and decision.reason is AdmitReason.INSTANCE


def test_an_instance_keeps_the_node_for_its_keep_alive_then_the_waiting_model_loads() -> None:
    node, out = run_scenario(policy_flags("serverless"), [TWO_CALLS_A, ONE_CALL_B])
    a0, a1, b0 = ok(out["s1"], 0), ok(out["s1"], 1), ok(out["s2"], 0)
    assert a1.arrival_s == approx(a0.finished_s + GAP)
    assert a1.admitted_s == approx(a1.arrival_s)  # an instance admits every call of its model
    assert a1.kv_source is KvSource.HBM  # a warm instance keeps its prefix cache
    first = node.slots[0]
    assert [s.model for s in node.slots] == ["a", "b"]
    assert first.close is CloseReason.IDLE
    assert first.end_s == approx(a1.finished_s + SERVERLESS_KEEP_ALIVE_S)  # b waited it out
    assert b0.admitted_s == approx(first.end_s + plain_switch_s(COST_A, COST_B))
    assert b0.finished_s == approx(b0.admitted_s + lone_call_s(COST_B, P0, OUT))


@settings(max_examples=30, deadline=None)
@given(
    agents=st.lists(
        st.tuples(
            st.sampled_from(("a", "b")),
            st.floats(0, 300),
            st.lists(st.tuples(st.integers(100, 3_000), st.floats(0, 120)), min_size=1, max_size=4),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_every_call_of_every_session_finishes_under_instances(
    agents: list[tuple[str, float, list[tuple[int, float]]]],
) -> None:
    """No call is lost or left waiting: an instance's keep-alive ends, and the waiting model
    gets the node; a slot closes only once idle (never on a quantum)."""
    built = [
        Agent(
            f"s{i}", model, start,
            tuple(Call(prompt + 100 * k, 20, gap_s=gap) for k, (prompt, gap) in enumerate(calls)),
        )
        for i, (model, start, calls) in enumerate(agents)
    ]  # fmt: skip
    node, out = run_scenario(policy_flags("serverless"), built)
    for agent in built:
        assert len(out[agent.session]) == len(agent.calls)
        assert all(isinstance(r, CallResult) for r in out[agent.session])
    assert all(s.close in (None, CloseReason.IDLE) for s in node.slots)
