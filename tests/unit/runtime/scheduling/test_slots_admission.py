"""The scheduler's pure rules, table-driven: slot order and closing (slots), admission
(admission), soft reservations (reservations) and the named policies (flags)."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

import pytest

from talaria.core.holds import Hold, HoldTable, ReleaseReason, plan_hold
from talaria.runtime.scheduling.admission import (
    AdmissionDecision,
    AdmitReason,
    decide_admission,
    fits_memory,
)
from talaria.runtime.scheduling.flags import (
    ABLATION_FLAGS,
    DEFAULT_POLICIES,
    FLAG_NAMES,
    ROUND,
    TALARIA,
    TALARIA_LEARNED,
    SchedulerFlags,
    policy_flags,
)
from talaria.runtime.scheduling.slots import CloseReason, close_reason, next_model

ORDER = ("a", "b", "c")


# -- slots.next_model ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("active", "waiting", "expected"),
    [
        # round-robin: the first model after the active one (wrapping) with waiting calls
        ("a", {"a": 1, "b": 1, "c": 1}, "b"),
        ("b", {"a": 1, "b": 1, "c": 1}, "c"),
        ("c", {"a": 1, "b": 1, "c": 1}, "a"),
        # models without waiting calls are skipped
        ("a", {"a": 1, "b": 0, "c": 2}, "c"),
        ("a", {"c": 2}, "c"),
        ("c", {"a": 0, "b": 3}, "b"),
        # the active model comes last: it keeps the node only when nobody else waits
        ("a", {"a": 4}, "a"),
        ("b", {"a": 0, "b": 1, "c": 0}, "b"),
        # no active model: start at the first in the order
        (None, {"a": 1, "b": 1}, "a"),
        (None, {"b": 1, "c": 1}, "b"),
        (None, {"c": 1}, "c"),
        # an active model outside the order: start at the first
        ("zzz", {"b": 1, "c": 1}, "b"),
        # nothing waiting
        ("a", {}, None),
        ("a", {"a": 0, "b": 0, "c": 0}, None),
        (None, {}, None),
        # counts for models outside the order are ignored
        ("a", {"zzz": 5}, None),
    ],
)
def test_next_model(active: str | None, waiting: dict[str, int], expected: str | None) -> None:
    assert next_model(ORDER, active, waiting) == expected


def test_next_model_empty_order() -> None:
    assert next_model((), None, {"a": 1}) is None


# -- slots.close_reason ----------------------------------------------------------------------
BASE_CLOSE: dict[str, Any] = dict(
    now_s=10.0,
    deadline_s=60.0,
    contended=True,
    running=0,
    admissible_waiting=False,
    live_holds=0,
)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # contended, nothing running, nothing admissible, no hold: idle
        ({}, CloseReason.IDLE),
        # uncontended never closes, whatever else holds
        ({"contended": False}, None),
        ({"contended": False, "now_s": 100.0}, None),
        ({"contended": False, "now_s": 60.0, "running": 3}, None),
        # quantum: at or past the deadline, even with work in flight
        ({"now_s": 60.0}, CloseReason.QUANTUM),
        ({"now_s": 61.0, "running": 2}, CloseReason.QUANTUM),
        ({"now_s": 60.0, "admissible_waiting": True, "live_holds": 1}, CloseReason.QUANTUM),
        # before the deadline, any of these keeps it open
        ({"running": 1}, None),
        ({"admissible_waiting": True}, None),
        ({"live_holds": 1}, None),  # a session in its tool gap, expected back
        ({"now_s": 59.999, "live_holds": 2}, None),
    ],
)
def test_close_reason(change: dict[str, Any], expected: CloseReason | None) -> None:
    assert close_reason(**{**BASE_CLOSE, **change}) == expected


# -- admission.decide_admission --------------------------------------------------------------
BASE_ADMIT: dict[str, Any] = dict(
    sp_admission=True,
    closing=False,
    in_slot_batch=False,
    contended=True,
    is_continuation=True,
    remaining_s=10.0,
    estimated_service_s=5.0,
)


ADMIT_TABLE: list[tuple[dict[str, Any], bool, AdmitReason]] = [
    # a closing slot admits nothing, not even its batch
    ({"closing": True}, False, AdmitReason.WAIT_CLOSING),
    ({"closing": True, "in_slot_batch": True}, False, AdmitReason.WAIT_CLOSING),
    ({"closing": True, "contended": False}, False, AdmitReason.WAIT_CLOSING),
    # waiting when the slot opened: the slot's batch, in every policy, whatever its size
    ({"in_slot_batch": True}, True, AdmitReason.SLOT_BATCH),
    (
        {"in_slot_batch": True, "sp_admission": False, "estimated_service_s": 1e9},
        True,
        AdmitReason.SLOT_BATCH,
    ),
    # arrived later, uncontended: continuous batching, in every policy
    ({"contended": False}, True, AdmitReason.UNCONTENDED),
    (
        {"contended": False, "sp_admission": False, "is_continuation": False},
        True,
        AdmitReason.UNCONTENDED,
    ),
    # arrived later, contended
    ({"sp_admission": False}, False, AdmitReason.WAIT_NEXT_SLOT),
    ({"is_continuation": False}, False, AdmitReason.WAIT_NOT_CONTINUATION),
    ({"estimated_service_s": 10.5}, False, AdmitReason.WAIT_OVER_TIME_BUDGET),
    ({"remaining_s": -1.0, "estimated_service_s": 0.0}, False, AdmitReason.WAIT_OVER_TIME_BUDGET),
    ({}, True, AdmitReason.SP_BUDGET),
    ({"estimated_service_s": 10.0}, True, AdmitReason.SP_BUDGET),  # exactly fits
    # request-level instances (serverless): every call of a resident model, session or not
    (
        {"instances": True, "sp_admission": False, "is_continuation": False},
        True,
        AdmitReason.INSTANCE,
    ),
    ({"instances": True, "closing": True}, False, AdmitReason.WAIT_CLOSING),
]


@pytest.mark.parametrize(("change", "admit", "reason"), ADMIT_TABLE)
def test_decide_admission(change: dict[str, Any], admit: bool, reason: AdmitReason) -> None:
    args = {**BASE_ADMIT, **change}
    service_s = args.pop("estimated_service_s")
    decision = decide_admission(**args, estimate_service_s=lambda: service_s)
    assert decision == AdmissionDecision(admit, reason)
    assert decision.sp is (reason is AdmitReason.SP_BUDGET)


def test_service_estimate_is_only_computed_when_the_time_budget_decides() -> None:
    calls: list[int] = []

    def estimate() -> float:
        calls.append(1)
        return 1.0

    for change, _, reason in ADMIT_TABLE:
        calls.clear()
        args = {**BASE_ADMIT, **change}
        args.pop("estimated_service_s")
        decide_admission(**args, estimate_service_s=estimate)
        budget_decides = reason in (AdmitReason.SP_BUDGET, AdmitReason.WAIT_OVER_TIME_BUDGET)
        assert bool(calls) is budget_decides


def test_every_admit_reason_is_covered() -> None:
    """Each reason is reachable: the table above has at least one row per reason."""
    assert {reason for _, _, reason in ADMIT_TABLE} == set(AdmitReason)


@pytest.mark.parametrize(
    ("needed", "free", "evictable", "held", "fits"),
    [
        (10.0, 10.0, 0.0, 0.0, True),  # exactly the free bytes
        (10.0, 9.0, 0.0, 0.0, False),
        (10.0, 4.0, 6.0, 0.0, True),  # free + evictable idle KV
        (10.0, 4.0, 6.0, 1.0, False),  # minus other sessions' holds
        (9.0, 4.0, 6.0, 1.0, True),
        (0.0, 0.0, 0.0, 0.0, True),
        (0.0, 0.0, 0.0, 1.0, False),  # holds beyond what is free
    ],
)
def test_fits_memory(needed: float, free: float, evictable: float, held: float, fits: bool) -> None:
    got = fits_memory(
        needed_bytes=needed, free_bytes=free, evictable_bytes=evictable, held_bytes=held
    )
    assert got is fits


# -- reservations ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("now", "gap", "deadline", "expires"),
    [
        (100.0, 3.0, None, 106.0),  # uncontended: no deadline; 2 × gap
        (100.0, 3.0, 103.0, 106.0),  # back exactly at the deadline: still taken
        (100.0, 0.5, 160.0, 101.5),  # short gap: gap + 1 s > 2 × gap
        (100.0, 1.0, 160.0, 102.0),  # the two rules meet at 1 s
        (100.0, 0.0, 160.0, 101.0),
        (0.0, 20.0, 60.0, 40.0),
    ],
)
def test_plan_reservation_taken(
    now: float, gap: float, deadline: float | None, expires: float
) -> None:
    res = plan_hold(
        session_key="s",
        model="m",
        now_s=now,
        expected_gap_s=gap,
        held_bytes=123.0,
        deadline_s=deadline,
    )
    assert res == Hold("s", "m", 123.0, now, now + gap, expires)
    assert res is not None and res.expires_s == now + max(2 * gap, gap + 1)


@pytest.mark.parametrize(("now", "gap", "deadline"), [(100.0, 3.0, 102.9), (0.0, 61.0, 60.0)])
def test_plan_reservation_refused_when_back_after_the_deadline(
    now: float, gap: float, deadline: float
) -> None:
    res = plan_hold(
        session_key="s",
        model="m",
        now_s=now,
        expected_gap_s=gap,
        held_bytes=1.0,
        deadline_s=deadline,
    )
    assert res is None


def test_plan_reservation_custom_slack() -> None:
    res = plan_hold(
        session_key="s",
        model="m",
        now_s=0.0,
        expected_gap_s=2.0,
        held_bytes=0.0,
        deadline_s=None,
        slack_factor=3.0,
        min_slack_s=5.0,
    )
    assert res is not None and res.expires_s == 7.0  # max(3 × 2, 2 + 5)


@pytest.mark.parametrize(
    ("hold", "expires", "slot_until"),
    [
        (20.0, 20.0, 6.0),  # a longer learned hold keeps the KV; the slot: the slack rule's
        (3.0, 6.0, 6.0),  # a shorter one: the slack rule's hold stands
    ],
)
def test_a_learned_hold_extends_the_kv_not_the_slot(
    hold: float, expires: float, slot_until: float
) -> None:
    res = plan_hold(
        session_key="s",
        model="m",
        now_s=0.0,
        expected_gap_s=3.0,  # slack rule: max(2 × 3, 3 + 1) = 6
        held_bytes=0.0,
        deadline_s=None,
        hold_gap_s=hold,
    )
    assert res is not None and (res.expires_s, res.slot_until_s) == (expires, slot_until)
    assert res.keeps_slot(5.9) and not res.keeps_slot(6.0)
    table = HoldTable()
    table.add(res)
    assert table.keeping_slot("m", 5.0) == 1 and table.keeping_slot("m", 7.0) == 0
    assert table.next_change_s(0.0) == 6.0 and table.next_change_s(6.0) == expires
    plain = plan_hold(
        session_key="s", model="m", now_s=0.0, expected_gap_s=3.0, held_bytes=0.0,
        deadline_s=None,
    )  # fmt: skip
    assert plain is not None and plain.slot_until_s is None and plain.keeps_slot(1e9)


def _res(session: str, model: str = "a", held: float = 1.0, expires: float = 10.0) -> Hold:
    return Hold(session, model, held, 0.0, expires / 2, expires)


def test_reservation_table_release_counts_only_live_reservations() -> None:
    table = HoldTable()
    assert table.released == dict.fromkeys(ReleaseReason, 0)
    table.add(_res("s1"))
    table.add(_res("s2"))
    table.add(_res("s3"))
    assert table.release("s1", ReleaseReason.RETURNED) == _res("s1")
    assert table.release("s1", ReleaseReason.RETURNED) is None  # already gone: not counted
    assert table.release("nobody", ReleaseReason.ENDED) is None
    assert table.release("s2", ReleaseReason.EXPIRED) is not None
    assert table.release("s3", ReleaseReason.SLOT_CLOSED) is not None
    table.add(_res("s4"))
    assert table.release("s4", ReleaseReason.MOVED) is not None
    assert table.released == {
        ReleaseReason.RETURNED: 1,
        ReleaseReason.ENDED: 0,
        ReleaseReason.EXPIRED: 1,
        ReleaseReason.SLOT_CLOSED: 1,
        ReleaseReason.MOVED: 1,
        ReleaseReason.OVER_SHARE: 0,
        ReleaseReason.STALE: 0,
    }
    assert not table.live


def test_reservation_table_queries() -> None:
    table = HoldTable()
    assert table.next_change_s(0.0) is None
    assert table.held_bytes() == 0.0
    table.add(_res("s1", "a", held=5.0, expires=10.0))
    table.add(_res("s2", "b", held=7.0, expires=4.0))
    table.add(_res("s3", "a", held=11.0, expires=20.0))
    assert table.next_change_s(0.0) == 4.0
    assert [r.session_key for r in table.expired(10.0)] == ["s1", "s2"]  # expires_s <= now
    assert table.expired(3.9) == []
    assert {r.session_key for r in table.for_model("a")} == {"s1", "s3"}
    assert table.held_bytes() == 23.0
    assert table.held_bytes(exclude_session="s3") == 12.0
    assert table.held_bytes(counts=lambda key: key != "s3") == 12.0
    assert table.held_bytes("s1", counts=lambda key: False) == 0.0
    table.add(_res("s1", "a", held=1.0, expires=30.0))  # a session holds one reservation
    assert len(table.live) == 3 and table.held_bytes() == 19.0


# -- flags.policy_flags ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "enabled"),
    [
        ("round", []),
        ("talaria", list(ABLATION_FLAGS)),
        ("talaria-learned", [*ABLATION_FLAGS, "learned_gaps"]),
        ("serverless", ["serverless_instances"]),
        ("+learned_gaps", ["learned_gaps"]),
        ("+sp_admission", ["sp_admission"]),
        ("+host_kv", ["host_kv"]),
        ("+d2d_staging", ["d2d_staging"]),
        ("+soft_reservations", ["soft_reservations"]),
    ],
)
def test_policy_flags(name: str, enabled: list[str]) -> None:
    flags = policy_flags(name)
    assert flags.enabled() == enabled
    assert asdict(flags) == {f: f in enabled for f in FLAG_NAMES}


def test_named_policies() -> None:
    assert policy_flags("round") == ROUND == SchedulerFlags()
    assert policy_flags("talaria") == TALARIA
    assert FLAG_NAMES == (
        "sp_admission",
        "host_kv",
        "d2d_staging",
        "soft_reservations",
        "demand_slots",
        "co_residency",
        "fair_queue",
        "learned_gaps",
        "serverless_instances",
    )
    assert FLAG_NAMES[:-2] == ABLATION_FLAGS
    assert all(getattr(TALARIA, f) for f in ABLATION_FLAGS) and not TALARIA.learned_gaps
    assert policy_flags("talaria-learned") == TALARIA_LEARNED == replace(TALARIA, learned_gaps=True)
    assert policy_flags("-co_residency") == replace(TALARIA, co_residency=False)
    four = replace(TALARIA, co_residency=False, demand_slots=False)
    assert policy_flags("-co_residency-demand_slots") == four
    assert policy_flags("+sp_admission+host_kv") == replace(ROUND, sp_admission=True, host_kv=True)
    one_flag = [f"+{f}" for f in ABLATION_FLAGS]  # learned_gaps is no default ablation
    assert list(DEFAULT_POLICIES) == ["round", *one_flag, "talaria"]
    for name in DEFAULT_POLICIES:
        policy_flags(name)


@pytest.mark.parametrize(
    "name", ["", "Round", "fifo", "+", "+nope", "-nope", "sp_admission", "+host_kv-sp_admission"]
)
def test_unknown_policy_raises_listing_choices(name: str) -> None:
    with pytest.raises(ValueError, match="unknown policy") as info:
        policy_flags(name)
    message = str(info.value)
    assert repr(name) in message
    for choice in DEFAULT_POLICIES:
        assert choice in message
