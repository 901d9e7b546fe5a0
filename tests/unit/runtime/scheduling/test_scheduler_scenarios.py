"""NodeScheduler on tiny hand-built scenarios, with exact expected times: the node, its round
figures and the harness are scenarios.py's (its docstring gives the figures).

Every expected time is written as a sum of ``CostModel`` terms, in the order the node pays them.
All runs are on the virtual-time loop: no wall-clock sleeps.
"""

from __future__ import annotations

import asyncio
import math
from itertools import accumulate

import pytest

from talaria.core.clock import LoopClock, VirtualTimeLoop, run_virtual
from talaria.core.gap_model import DEFAULT_GAP_PRIOR_S
from talaria.core.holds import DEFAULT_MAX_HINT_GAP_S, ReleaseReason
from talaria.core.status import RECENT_SLOTS, SlotView, TenantShare
from talaria.core.types import DEFAULT_TENANT, CallRequest, CallResult, KvSource
from talaria.runtime.costmodel import PrefillChunk
from talaria.runtime.engines.sim import STAGING_CHUNKS
from talaria.runtime.scheduling.calls import UnknownModelError
from talaria.runtime.scheduling.config import SchedulerConfig
from talaria.runtime.scheduling.flags import DEFAULT_POLICIES, SchedulerFlags, policy_flags
from talaria.runtime.scheduling.intake import CallTooLargeError
from talaria.runtime.scheduling.slots import CloseReason
from talaria.sim.replay import build_node
from tests.unit.runtime.scheduling.scenarios import (
    APPEND,
    CACHED,
    CATALOG,
    COST_A,
    COST_B,
    GAP,
    ONE_CALL_B,
    OUT,
    P0,
    P1,
    PROFILE,
    SERVER,
    SETUP,
    SHARED,
    SP_SOFT,
    TWO_CALLS_A,
    WEIGHTS,
    Agent,
    Call,
    approx,
    cancel_leftovers,
    lone_call_s,
    ok,
    plain_switch_s,
    run_probed,
    run_scenario,
)


def test_catalog_numbers_are_the_round_ones_the_scenarios_assume() -> None:
    assert COST_A.weight_wake_time_s() == pytest.approx(4.0)
    assert COST_A.weight_sleep_time_s() == pytest.approx(2.0)
    assert COST_A.d2d_switch_time_s() == pytest.approx(0.08)
    assert COST_A.kv_bytes(SHARED) == 1024 * 1_000_000
    assert COST_A.kv_transfer_time_s(COST_A.kv_bytes(SHARED)) == pytest.approx(0.1024)
    assert COST_A.decode_step_time_s(1, 1000) == pytest.approx(0.01 + 0.04 + 1000e-6)
    assert SERVER.usable_hbm_bytes >= 2 * WEIGHTS  # staging the other model fits


# -- +sp_admission ---------------------------------------------------------------------------
LONG_OUT = 100
SP_AGENTS = (
    Agent("long", "a", 0.0, (Call(P0, LONG_OUT),)),  # keeps a's slot open (running)
    TWO_CALLS_A,
    ONE_CALL_B,  # makes a's slot contended
)


def _sp_common() -> tuple[float, float]:
    """Slot a opens after a's wake; "long" and s1's call 0 prefill together in one step, then
    decode as a batch of two until s1's call 0 ends (OUT − 1 steps)."""
    t_open = COST_A.weight_wake_time_s()
    both = [PrefillChunk(P0, 0), PrefillChunk(P0, 0)]
    t_first = t_open + COST_A.step_time_s(both, 0, 0)
    t_a0 = t_first + sum(COST_A.decode_step_time_s(2, 2 * P0 + 2 * i) for i in range(OUT - 1))
    return t_open, t_a0


def test_round_continuation_waits_for_the_models_next_slot() -> None:
    node, out = run_scenario(policy_flags("round"), SP_AGENTS)
    t_open, t_a0 = _sp_common()
    assert ok(out["s1"], 0).admitted_s == approx(t_open)
    assert ok(out["s1"], 0).finished_s == approx(t_a0)
    # "long" then decodes alone from context P0 + OUT − 1 until its last token.
    t_long = t_a0 + sum(COST_A.decode_step_time_s(1, P0 + OUT - 1 + i) for i in range(90))
    assert ok(out["long"], 0).finished_s == approx(t_long)
    # s1's call 1 (arrived at t_a0 + GAP) waits: a's slot closes idle when "long" ends, b gets
    # its slot (switch a → b), then a comes back (switch b → a) with s1's KV dropped.
    t_b_open = t_long + plain_switch_s(COST_A, COST_B)
    t_b0 = t_b_open + lone_call_s(COST_B, P0, OUT)
    t_a_again = t_b0 + plain_switch_s(COST_B, COST_A)
    a1 = ok(out["s1"], 1)
    assert a1.arrival_s == approx(t_a0 + GAP)
    assert not a1.sp_admitted
    assert a1.admitted_s == approx(t_a_again)
    assert a1.kv_source is KvSource.RECOMPUTE
    assert a1.finished_s == approx(t_a_again + lone_call_s(COST_A, P1, OUT))
    assert [s.model for s in node.slots] == ["a", "b", "a"]
    assert node.slots[0].close is CloseReason.IDLE
    assert node.slots[0].end_s == approx(t_long)


def test_sp_admission_serves_the_continuation_in_the_same_slot() -> None:
    node, out = run_scenario(policy_flags("+sp_admission"), SP_AGENTS)
    _, t_a0 = _sp_common()
    a1 = ok(out["s1"], 1)
    t_arrival = t_a0 + GAP
    assert a1.sp_admitted
    assert a1.admitted_s == approx(t_arrival)
    assert (a1.kv_source, a1.cached_tokens) == (KvSource.HBM, CACHED)
    # "long" decodes alone from context P0 + OUT − 1; the engine takes a1 in at the first step
    # boundary after its arrival.
    ends = list(accumulate(COST_A.decode_step_time_s(1, P0 + OUT - 1 + i) for i in range(90)))
    j = next(i for i, end in enumerate(ends) if end > GAP)
    assert ends[j] - GAP > 1e-6 and (j == 0 or GAP - ends[j - 1] > 1e-6)  # no boundary tie
    long_context = P0 + OUT - 1 + (j + 1)
    t_boundary = t_a0 + ends[j]
    # One mixed step: "long" decodes one token, a1 prefills its P1 − CACHED uncached tokens.
    t_first = t_boundary + COST_A.step_time_s([PrefillChunk(P1 - CACHED, CACHED)], long_context, 1)
    assert a1.first_token_s == approx(t_first)
    # Then both decode as a batch of two until a1's last token.
    batch_context = (long_context + 1) + P1
    t_fin = t_first + sum(COST_A.decode_step_time_s(2, batch_context + 2 * i) for i in range(9))
    assert a1.finished_s == approx(t_fin)
    assert node.slots[0].model == "a" and node.slots[0].sp_admitted == 1
    assert node.slots[0].end_s is not None and node.slots[0].end_s > a1.finished_s


# -- +host_kv --------------------------------------------------------------------------------
HOST_AGENTS = (
    Agent("s1", "a", 0.0, (Call(P0, OUT, gap_s=1.0), Call(P1, OUT))),
    ONE_CALL_B,
)


@pytest.mark.parametrize("policy", ["round", "+host_kv"])
def test_host_kv_restores_the_prefix_after_a_switch_away_and_back(policy: str) -> None:
    host_kv = policy == "+host_kv"
    node, out = run_scenario(policy_flags(policy), HOST_AGENTS)
    t_a0 = COST_A.weight_wake_time_s() + lone_call_s(COST_A, P0, OUT)
    assert ok(out["s1"], 0).finished_s == approx(t_a0)
    # Switch a → b: with host_kv, s1's KV (SHARED tokens) is offloaded over PCIe first.
    offload = COST_A.kv_transfer_time_s(COST_A.kv_bytes(SHARED)) if host_kv else 0.0
    switch_away = offload + plain_switch_s(COST_A, COST_B)
    assert node.slots[1].model == "b"
    assert node.slots[1].switch_s == approx(switch_away)
    t_b0 = t_a0 + switch_away + lone_call_s(COST_B, P0, OUT)
    assert ok(out["s2"], 0).finished_s == approx(t_b0)
    # Switch b → a: s2 ended, so b has no KV to offload.
    t_a_again = t_b0 + plain_switch_s(COST_B, COST_A)
    assert node.slots[2].switch_s == approx(plain_switch_s(COST_B, COST_A))
    a1 = ok(out["s1"], 1)
    assert a1.admitted_s == approx(t_a_again)
    if host_kv:
        assert a1.kv_source is KvSource.HOST
        assert a1.cached_tokens == CACHED
        assert a1.restored_bytes == COST_A.kv_bytes(CACHED)
        assert a1.recomputed_tokens == 0
        restore = COST_A.kv_transfer_time_s(COST_A.kv_bytes(CACHED))
        t_first = t_a_again + restore + COST_A.prefill_time_s(P1 - CACHED, CACHED)
    else:
        assert a1.kv_source is KvSource.RECOMPUTE
        assert a1.cached_tokens == 0
        assert a1.restored_bytes == 0.0
        assert a1.recomputed_tokens == SHARED
        t_first = t_a_again + COST_A.prefill_time_s(P1, 0)
    assert a1.first_token_s == approx(t_first)
    assert a1.finished_s == approx(t_first + COST_A.decode_time_s(OUT - 1, P1, 1))


# -- +d2d_staging ----------------------------------------------------------------------------
@pytest.mark.parametrize("a_output", [100, 20], ids=["staging-done", "staging-partial"])
@pytest.mark.parametrize("policy", ["round", "+d2d_staging"])
def test_d2d_staging_switches_by_device_copy(policy: str, a_output: int) -> None:
    node, out = run_scenario(
        policy_flags(policy), (Agent("s1", "a", 0.0, (Call(P0, a_output),)), ONE_CALL_B)
    )
    t_open = COST_A.weight_wake_time_s()
    assert node.slots[0].switch_s == approx(t_open)  # first activation: a full wake either way
    t_a0 = t_open + lone_call_s(COST_A, P0, a_output)
    assert node.slots[0].end_s == approx(t_a0)
    if policy == "round":
        switch = plain_switch_s(COST_A, COST_B)
    else:
        # b's weights are staged from a's slot opening, STAGING_CHUNKS chunks back to back;
        # a chunk cut by the switch is lost and paid again at the switch.
        chunk = WEIGHTS / STAGING_CHUNKS
        elapsed_chunks = (t_a0 - t_open) / COST_B.weight_stage_time_s(chunk)
        assert abs(elapsed_chunks - round(elapsed_chunks)) > 1e-6  # no boundary tie
        done = min(STAGING_CHUNKS, math.floor(elapsed_chunks))
        remaining = WEIGHTS - done * chunk
        switch = COST_B.weight_stage_time_s(remaining) + COST_B.d2d_switch_time_s()
        if a_output == 100:
            assert done == STAGING_CHUNKS and switch == approx(COST_B.d2d_switch_time_s())
        else:
            assert 0 < done < STAGING_CHUNKS
    assert node.slots[1].model == "b"
    assert node.slots[1].start_s == approx(t_a0)
    assert node.slots[1].switch_s == approx(switch)
    b0 = ok(out["s2"], 0)
    assert b0.admitted_s == approx(t_a0 + switch)
    assert b0.finished_s == approx(t_a0 + switch + lone_call_s(COST_B, P0, OUT))


# -- +soft_reservations (with SP) ------------------------------------------------------------
@pytest.mark.parametrize("flags", [SP_SOFT, policy_flags("talaria")], ids=["sp+soft", "talaria"])
def test_soft_reservation_keeps_the_slot_open_through_the_tool_gap(
    flags: SchedulerFlags,
) -> None:
    node, out = run_scenario(flags, (TWO_CALLS_A, ONE_CALL_B))
    t_a0 = COST_A.weight_wake_time_s() + lone_call_s(COST_A, P0, OUT)
    assert ok(out["s1"], 0).finished_s == approx(t_a0)
    # Without the reservation the contended slot would close IDLE at t_a0; it stays open and
    # the continuation is admitted (SP) on arrival, its prefix still in HBM.
    a1 = ok(out["s1"], 1)
    assert a1.sp_admitted
    assert a1.admitted_s == approx(t_a0 + GAP)
    assert (a1.kv_source, a1.cached_tokens) == (KvSource.HBM, CACHED)
    t_fin = t_a0 + GAP + lone_call_s(COST_A, P1, OUT, cached=CACHED)
    assert a1.finished_s == approx(t_fin)
    first = node.slots[0]
    assert (first.model, first.close, first.admitted, first.sp_admitted) == (
        "a",
        CloseReason.IDLE,
        2,
        1,
    )
    assert first.end_s == approx(t_fin)
    assert [s.model for s in node.slots] == ["a", "b"]  # no switch between s1's calls
    assert node.holds.released[ReleaseReason.RETURNED] == 1
    assert not node.holds.live


def test_without_soft_reservations_the_slot_closes_idle_in_the_tool_gap() -> None:
    node, out = run_scenario(policy_flags("+sp_admission"), (TWO_CALLS_A, ONE_CALL_B))
    t_a0 = COST_A.weight_wake_time_s() + lone_call_s(COST_A, P0, OUT)
    assert node.slots[0].close is CloseReason.IDLE
    assert node.slots[0].end_s == approx(t_a0)
    t_b0 = t_a0 + plain_switch_s(COST_A, COST_B) + lone_call_s(COST_B, P0, OUT)
    t_a_again = t_b0 + plain_switch_s(COST_B, COST_A)
    a1 = ok(out["s1"], 1)
    assert not a1.sp_admitted
    assert a1.admitted_s == approx(t_a_again)
    assert a1.kv_source is KvSource.RECOMPUTE
    assert [s.model for s in node.slots] == ["a", "b", "a"]


@pytest.mark.parametrize(
    ("hint_s", "gap_s"),
    [(2.0, 2.0), (None, DEFAULT_GAP_PRIOR_S)],
    ids=["hinted-gap", "prior-gap"],
)
def test_reservation_of_a_session_that_never_returns_expires(
    hint_s: float | None, gap_s: float
) -> None:
    gone = Agent("s1", "a", 0.0, (Call(P0, OUT, hint_s=hint_s),), ends=False)
    node, out = run_scenario(SP_SOFT, (gone, ONE_CALL_B))
    t_a0 = COST_A.weight_wake_time_s() + lone_call_s(COST_A, P0, OUT)
    assert ok(out["s1"], 0).finished_s == approx(t_a0)
    # Held until now + max(2 × gap, gap + 1 s), then the slot closes idle and b gets the node.
    t_expiry = t_a0 + max(2 * gap_s, gap_s + 1.0)
    assert node.slots[0].close is CloseReason.IDLE
    assert node.slots[0].end_s == approx(t_expiry)
    assert node.slots[1].model == "b"
    b0 = ok(out["s2"], 0)
    assert b0.admitted_s == approx(t_expiry + plain_switch_s(COST_A, COST_B))
    assert node.holds.released == {
        ReleaseReason.RETURNED: 0,
        ReleaseReason.ENDED: 0,
        ReleaseReason.EXPIRED: 1,
        ReleaseReason.SLOT_CLOSED: 0,
        ReleaseReason.MOVED: 0,
        ReleaseReason.OVER_SHARE: 0,
        ReleaseReason.STALE: 0,
    }
    assert not node.holds.live


def test_a_days_hint_holds_for_the_hint_cap_at_most() -> None:
    """A hint counts as ``max_hint_gap_s`` (240 s) at most (issue 46): a session hinting a
    day's tool gap is expected back in 240 s and held 2 × 240 s, not two days."""
    gone = Agent("s1", "a", 0.0, (Call(P0, OUT, hint_s=86_400.0),), ends=False)
    node, out = run_scenario(SP_SOFT, (gone,))
    finished_s = ok(out["s1"], 0).finished_s
    held = node.holds.live["s1"]
    assert held.expected_return_s == approx(finished_s + DEFAULT_MAX_HINT_GAP_S)
    assert held.expires_s == approx(finished_s + 2 * DEFAULT_MAX_HINT_GAP_S)


# -- uncontended continuous batching ---------------------------------------------------------
@pytest.mark.parametrize("policy", DEFAULT_POLICIES)
def test_uncontended_calls_are_admitted_on_arrival_in_every_policy(policy: str) -> None:
    agents = (
        Agent("s1", "a", 0.0, (Call(P0, 100, gap_s=GAP), Call(P0 + 100 + APPEND, OUT))),
        Agent("s2", "a", 6.0, (Call(P0, OUT),)),  # arrives mid-slot, while s1's call 0 runs
    )
    node, out = run_scenario(policy_flags(policy), agents)
    t_open = COST_A.weight_wake_time_s()
    late = ok(out["s2"], 0)
    assert (late.arrival_s, late.admitted_s) == (6.0, 6.0)
    assert not late.sp_admitted
    a0, a1 = ok(out["s1"], 0), ok(out["s1"], 1)
    assert a0.admitted_s == approx(t_open)
    assert a1.admitted_s == approx(a1.arrival_s)
    assert a1.arrival_s == approx(a0.finished_s + GAP)
    assert not a1.sp_admitted
    # s1's call 1 runs alone, its prefix still in HBM.
    shared = P0 + 100
    cached = shared - shared % PROFILE.block_tokens
    assert (a1.kv_source, a1.cached_tokens) == (KvSource.HBM, cached)
    prompt = shared + APPEND
    assert a1.finished_s == approx(a1.arrival_s + lone_call_s(COST_A, prompt, OUT, cached))
    assert len(node.slots) == 1 and node.slots[0].close is None


# -- slot wait -------------------------------------------------------------------------------
WAKE_A = COST_A.weight_wake_time_s()
T_A0 = WAKE_A + lone_call_s(COST_A, P0, OUT)  # s1's call 0 alone in a's first slot
T_B_OPEN = T_A0 + plain_switch_s(COST_A, COST_B)
T_A_AGAIN = T_B_OPEN + lone_call_s(COST_B, P0, OUT) + plain_switch_s(COST_B, COST_A)
BIG = 35_000  # 35 GB of KV: two do not fit beside a's weights (60 GB of room)


@pytest.mark.parametrize(
    ("agents", "expected"),
    [
        pytest.param(
            (Agent("s1", "a", 0.0, (Call(P0, OUT),)),),
            {("s1", 0): (WAKE_A, WAKE_A)},  # arrived before the node began waking a
            id="first-call-waits-the-whole-switch",
        ),
        pytest.param(
            (Agent("s1", "a", 0.0, (Call(P0, OUT),)), Agent("s2", "a", 1.0, (Call(P0, OUT),))),
            {("s1", 0): (WAKE_A, WAKE_A), ("s2", 0): (WAKE_A - 1.0, WAKE_A - 1.0)},
            id="arrives-during-its-models-switch-waits-the-rest",
        ),
        pytest.param(
            (Agent("s1", "a", 0.0, (Call(P0, 100),)), Agent("s2", "a", 6.0, (Call(P0, OUT),))),
            {("s2", 0): (0.0, 0.0)},  # a serves from WAKE_A (4 s)
            id="active-model-no-slot-wait",
        ),
        pytest.param(
            (Agent("s1", "a", 0.0, (Call(BIG, OUT),)), Agent("s2", "a", 5.0, (Call(BIG, OUT),))),
            # a is active: s2 waits for s1's KV to leave, inside a's slot
            {("s2", 0): (0.0, WAKE_A + lone_call_s(COST_A, BIG, OUT) - 5.0)},
            id="active-model-waiting-for-memory-no-slot-wait",
        ),
        pytest.param(
            (TWO_CALLS_A, ONE_CALL_B),
            # s2 waits through a's slot and the switch a → b; s1's call 1 arrives after a's
            # slot closed and waits through b's slot and the switch back
            {
                ("s2", 0): (T_B_OPEN, T_B_OPEN),
                ("s1", 1): (T_A_AGAIN - (T_A0 + GAP), T_A_AGAIN - (T_A0 + GAP)),
            },
            id="other-model-active-waits-for-its-slot",
        ),
    ],
)
def test_slot_wait_is_the_wait_until_the_models_slot_opened(
    agents: tuple[Agent, ...], expected: dict[tuple[str, int], tuple[float, float]]
) -> None:
    """``expected``: call → (slot wait, queue time)."""
    _, out = run_scenario(policy_flags("round"), agents)
    for (session, index), (slot_wait, queue) in expected.items():
        result = ok(out[session], index)
        assert (result.slot_wait_s, result.queue_s) == (approx(slot_wait), approx(queue))
    for outcome in out.values():
        for i in range(len(outcome)):
            result = ok(outcome, i)
            assert 0.0 <= result.slot_wait_s <= result.queue_s + 1e-9, result.request_id


# -- status: recent slots and per-model queues -----------------------------------------------
def test_status_shows_the_slots_and_each_models_queue() -> None:
    agents = (
        Agent("s1", "a", 0.0, (Call(P0, 100),)),
        Agent("s2", "b", 0.0, (Call(P0, OUT),)),
        Agent("s3", "b", 0.0, (Call(P0, OUT),)),
    )
    mid_wake, mid_slot = 1.0, WAKE_A + 1.0
    node, out, (waking, serving, done) = run_probed(
        policy_flags("round"), agents, (mid_wake, mid_slot)
    )
    # waking a: no slot yet; a's call and b's two are queued
    assert waking.recent_slots == []
    assert {m: r.waiting_calls for m, r in waking.models.items()} == {"a": 1, "b": 2}
    assert waking.waiting_calls == 3
    # a's slot is open (switch 0 → WAKE_A) and has admitted s1; b's calls still wait
    assert serving.recent_slots == [SlotView("a", 0.0, WAKE_A, admitted=1)]
    assert {m: r.waiting_calls for m, r in serving.models.items()} == {"a": 0, "b": 2}
    # after the switch to b: a's slot closed when s1 ended, b's is the open one
    t_a = WAKE_A + lone_call_s(COST_A, P0, 100)
    first, last = done.recent_slots
    assert (first.model, first.close, first.admitted) == ("a", "idle", 1)
    assert first.end_s == approx(t_a)
    assert (last.model, last.end_s, last.close, last.admitted) == ("b", None, None, 2)
    assert last.start_s == approx(t_a)
    assert last.switch_s == approx(plain_switch_s(COST_A, COST_B))
    assert done.active_model == "b"
    assert {m: r.waiting_calls for m, r in done.models.items()} == {"a": 0, "b": 0}
    assert all(ok(o, i) for o in out.values() for i in range(len(o)))
    assert len(node.slots) == 2
    # the tenant's share: its queue while waking, its measured service when done
    assert waking.tenants == {DEFAULT_TENANT: TenantShare(0.0, 3, 0, approx(mid_wake))}
    served = sum(
        ok(o, i).finished_s - ok(o, i).admitted_s for o in out.values() for i in range(len(o))
    )
    assert done.tenants == {DEFAULT_TENANT: TenantShare(approx(served), 0, 0, 0.0)}


def test_status_keeps_only_the_latest_slots() -> None:
    # one call every 20 s, alternating models: each one closes the other model's idle slot
    n = RECENT_SLOTS + 6
    agents = tuple(Agent(f"s{i}", "ab"[i % 2], 20.0 * i, (Call(P0, OUT),)) for i in range(n))
    node, _, (done,) = run_probed(policy_flags("round"), agents, ())
    assert [s.model for s in node.slots] == ["ab"[i % 2] for i in range(n)]
    assert len(done.recent_slots) == RECENT_SLOTS
    kept = node.slots[-RECENT_SLOTS:]
    assert [(v.model, v.start_s, v.end_s) for v in done.recent_slots] == [
        (s.model, s.start_s, s.end_s) for s in kept
    ]
    assert done.recent_slots[0].start_s == approx(20.0 * (n - RECENT_SLOTS))
    assert done.recent_slots[-1].end_s is None  # the open slot, last


# -- errors ----------------------------------------------------------------------------------
TOO_BIG = 70_000  # 70 GB of KV > 100 GB HBM − 40 GB of weights


def test_call_larger_than_hbm_fails_and_the_node_keeps_serving() -> None:
    agents = (
        Agent("big", "a", 0.0, (Call(TOO_BIG, OUT),)),
        Agent("s2", "a", 10.0, (Call(P0, OUT),)),
    )
    node, out = run_scenario(policy_flags("round"), agents)
    assert COST_A.kv_bytes(TOO_BIG + OUT) > SERVER.usable_hbm_bytes - WEIGHTS
    (error,) = out["big"]
    assert isinstance(error, CallTooLargeError)
    later = ok(out["s2"], 0)
    assert later.admitted_s == 10.0
    assert later.finished_s == approx(10.0 + lone_call_s(COST_A, P0, OUT))
    assert len(node.slots) == 1


def test_call_queued_behind_a_too_large_call_is_still_served() -> None:
    agents = (
        Agent("big", "a", 0.0, (Call(TOO_BIG, OUT),)),
        Agent("s2", "a", 1.0, (Call(P0, OUT),)),  # waits for a's slot behind "big"
    )
    _, out = run_scenario(policy_flags("round"), agents)
    assert isinstance(out["big"][0], CallTooLargeError)
    assert ok(out["s2"], 0).admitted_s == approx(COST_A.weight_wake_time_s())


def test_call_queued_behind_a_too_large_call_is_served_without_waiting_a_quantum() -> None:
    agents = (
        Agent("big", "a", 0.0, (Call(TOO_BIG, OUT),)),
        Agent("s3", "a", 1.0, (Call(P0, OUT),)),
        ONE_CALL_B,
    )
    _, out = run_scenario(policy_flags("round"), agents)
    assert isinstance(out["big"][0], CallTooLargeError)
    assert ok(out["s3"], 0).admitted_s == approx(COST_A.weight_wake_time_s())


def test_ending_a_session_with_a_call_still_queued_does_not_kill_the_node() -> None:
    async def main() -> list[CallResult | BaseException]:
        clock = LoopClock()
        node = build_node("n0", SETUP, CATALOG, policy_flags("round"), SchedulerConfig(), clock)
        node.start()
        # one session, two concurrent calls (a on "a" marked final, one on "b"), and a
        # bystander session on "b"
        calls = [
            CallRequest("x/a", "x", "a", P0, OUT, session_final=True),
            CallRequest("x/b", "x", "b", P0, OUT),
            CallRequest("y/0", "y", "b", P0, OUT, session_final=True),
        ]
        try:
            return await asyncio.gather(*(node.submit(c) for c in calls), return_exceptions=True)
        finally:
            await node.stop()

    loop = VirtualTimeLoop()
    try:
        results = loop.run_until_complete(main())
    finally:
        cancel_leftovers(loop)
        loop.close()
    assert isinstance(results[0], CallResult)
    assert isinstance(results[2], CallResult)  # the bystander is served


# -- stopping --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "last_ends",
    [
        True,
        False,  # regression: LoopClock.wait_event once used wait_for, which lost the cancel
    ],
)
def test_stop_right_after_the_last_call(last_ends: bool) -> None:
    """s1's reservation gives the loop a timer, so it waits through ``asyncio.wait_for``; the
    last call's finish sets the loop's wake event after its result (it is not session_final),
    and the harness stops the node right then."""
    agents = (
        Agent("s1", "a", 0.0, (Call(P0, OUT),), ends=False),
        Agent("s0", "a", 0.0, (Call(P0, 100),), ends=last_ends),
    )
    node, out = run_scenario(policy_flags("+soft_reservations"), agents)
    assert ok(out["s0"], 0).finished_s > ok(out["s1"], 0).finished_s
    # s1 (and s0 when it did not end) still hold their reservations: neither came back
    expected = {"s1"} if last_ends else {"s1", "s0"}
    assert set(node.holds.live) == expected


def test_unknown_model_raises() -> None:
    async def main() -> None:
        clock = LoopClock()
        node = build_node("n0", SETUP, CATALOG, policy_flags("round"), SchedulerConfig(), clock)
        node.start()
        with pytest.raises(UnknownModelError, match="'zzz'"):
            await node.submit(CallRequest("x/0", "x", "zzz", 10, 1))
        assert node.waiting_counts() == {"a": 0, "b": 0}
        await node.stop()

    run_virtual(main())
