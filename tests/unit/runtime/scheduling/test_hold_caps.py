"""What one tenant's soft reservations may keep when another tenant's call needs the memory
(runtime/scheduling/hold_caps.py): the weight share, staleness and the release order, as
tables; and ``KvHolds.make_room`` releasing them, unpinning their KV, and stopping once the
call fits."""

from __future__ import annotations

import pytest

from talaria.core.holds import Hold, ReleaseReason
from talaria.core.types import CallRequest, CallResult, KvSource
from talaria.runtime.memory.resources import KvLocation, NodeMemory, SessionKv
from talaria.runtime.scheduling.hold_caps import (
    HeldKv,
    is_stale,
    over_share,
    tenant_caps_bytes,
    yielding,
)
from talaria.runtime.scheduling.holds import KvHolds
from talaria.runtime.scheduling.sessions import NodeSessions

OVER, STALE = ReleaseReason.OVER_SHARE, ReleaseReason.STALE


def _hold(key: str, tenant: str, gb: float, created_s: float = 0.0, back_s: float = 10.0,
          gap_s: float = 3.2) -> HeldKv:  # fmt: skip
    return HeldKv(key, tenant, gb * 1e9, created_s, back_s, gap_s)


CAPS = [
    # (live tenants' weights, room GB, each one's cap GB)
    ({"a": 1.0}, 100.0, {"a": 100.0}),  # a lone tenant keeps everything
    ({"a": 1.0, "b": 1.0}, 100.0, {"a": 50.0, "b": 50.0}),
    ({"a": 3.0, "b": 1.0}, 100.0, {"a": 75.0, "b": 25.0}),
    ({"a": 100.0, "b": 1.0}, 101.0, {"a": 100.0, "b": 1.0}),
    ({}, 100.0, {}),
]


@pytest.mark.parametrize(("weights", "room_gb", "caps_gb"), CAPS)
def test_a_tenants_cap_is_its_weight_share_of_the_room(
    weights: dict[str, float], room_gb: float, caps_gb: dict[str, float]
) -> None:
    caps = tenant_caps_bytes(weights, room_gb * 1e9)
    assert {t: pytest.approx(c / 1e9) for t, c in caps.items()} == caps_gb


OVER_SHARE = [
    # (holds: key, tenant, GB, expected back at; weights; room GB; the keys past their share)
    ([("a1", "a", 30, 5), ("a2", "a", 30, 6)], {"a": 1, "b": 1}, 100, ["a2"]),  # 60 > 50
    ([("a1", "a", 30, 6), ("a2", "a", 30, 5)], {"a": 1, "b": 1}, 100, ["a1"]),  # soonest kept
    ([("a1", "a", 30, 5), ("a2", "a", 20, 6)], {"a": 1, "b": 1}, 100, []),  # 50: at the cap
    ([("a1", "a", 60, 5), ("a2", "a", 1, 6)], {"a": 1, "b": 1}, 100, ["a1", "a2"]),  # prefix
    ([("a1", "a", 90, 5)], {"a": 1}, 100, []),  # alone: no one to yield to
    ([("a1", "a", 1, 5)], {"b": 1}, 100, ["a1"]),  # a has no live session: no share
    ([("a1", "a", 40, 5), ("b1", "b", 40, 5)], {"a": 1, "b": 1}, 100, []),
    ([("a1", "a", 40, 5), ("b1", "b", 40, 5)], {"a": 1, "b": 3}, 100, ["a1"]),  # a's: 25
]


@pytest.mark.parametrize(("holds", "weights", "room_gb", "past"), OVER_SHARE)
def test_holds_past_their_tenants_share_counted_soonest_back_first(
    holds: list[tuple[str, str, float, float]],
    weights: dict[str, float],
    room_gb: float,
    past: list[str],
) -> None:
    held = [_hold(k, t, gb, back_s=back) for k, t, gb, back in holds]
    assert sorted(h.session_key for h in over_share(held, weights, room_gb * 1e9)) == past


STALE_CASES = [
    # (created at, its session's mean gap, now, stale)
    (0.0, 3.2, 12.8, False),  # 4 mean gaps exactly: not yet
    (0.0, 3.2, 12.9, True),
    (100.0, 60.0, 340.0, False),  # a session that really waits a minute keeps 4 minutes
    (100.0, 60.0, 341.0, True),
]


@pytest.mark.parametrize(("created_s", "gap_s", "now_s", "stale"), STALE_CASES)
def test_a_hold_is_stale_past_four_mean_gaps_of_its_session(
    created_s: float, gap_s: float, now_s: float, stale: bool
) -> None:
    assert is_stale(_hold("s", "a", 1, created_s, gap_s=gap_s), now_s) is stale


YIELDING = [
    # (holds: key, tenant, GB, created, back; the asking tenant; weights; now; the order)
    (  # a past its half: the latest expected back first, then b's own are never touched
        [("a1", "a", 40, 0, 5), ("a2", "a", 20, 0, 9), ("a3", "a", 20, 0, 7), ("b1", "b", 5, 0, 5)],
        "b", {"a": 1, "b": 1}, 1.0,
        [("a2", OVER), ("a3", OVER)],
    ),
    (  # within its share, a's stale holds yield, the oldest first; the fresh one stays
        [("a1", "a", 10, 5, 50), ("a2", "a", 10, 1, 50), ("a3", "a", 10, 99, 150)],
        "b", {"a": 1, "b": 1}, 100.0,
        [("a2", STALE), ("a1", STALE)],
    ),
    (  # past the share first, then stale
        [("a1", "a", 30, 0, 5), ("a2", "a", 30, 90, 95)],
        "b", {"a": 1, "b": 1}, 100.0,
        [("a2", OVER), ("a1", STALE)],
    ),
    (  # a tenant's own holds never yield to its own call
        [("a1", "a", 90, 0, 5)],
        "a", {"a": 1, "b": 1}, 100.0,
        [],
    ),
    (  # weight 100 against 1: a keeps 99 %, only its stale holds go
        [("a1", "a", 49, 0, 5), ("a2", "a", 49, 95, 99)],
        "b", {"a": 100, "b": 1}, 100.0,
        [("a1", STALE)],
    ),
]  # fmt: skip


@pytest.mark.parametrize(("holds", "tenant", "weights", "now_s", "order"), YIELDING)
def test_what_yields_to_another_tenants_call_and_in_which_order(
    holds: list[tuple[str, str, float, float, float]],
    tenant: str,
    weights: dict[str, float],
    now_s: float,
    order: list[tuple[str, ReleaseReason]],
) -> None:
    held = [_hold(k, t, gb, created, back) for k, t, gb, created, back in holds]
    assert yielding(held, tenant, weights, 100e9, now_s) == order


# -- KvHolds.make_room -------------------------------------------------------------------------
GB = 1e9


def _ended_at_zero(key: str) -> CallResult:
    return CallResult(
        "r",
        key,
        "m",
        "n0",
        1000,
        0,
        10,
        arrival_s=0.0,
        admitted_s=0.0,
        first_token_s=0.0,
        finished_s=0.0,
        kv_source=KvSource.NEW,
        restored_bytes=0.0,
        recomputed_tokens=0,
        sp_admitted=False,
    )


def _holds_of(tenants: dict[str, str]) -> tuple[KvHolds, NodeMemory]:
    """A node of 100 GB of KV room, each session of ``tenants`` holding 20 GB of KV pinned by
    a reservation taken at 0 s (expected back in order of their names)."""
    memory = NodeMemory(hbm_capacity_bytes=100 * GB, host_kv_capacity_bytes=0.0)
    sessions = NodeSessions()
    holds = KvHolds(memory, None, sessions)
    for n, (key, tenant) in enumerate(sorted(tenants.items())):
        request = CallRequest(key, key, "m", 1000, 10, tenant=tenant)
        sessions.arrived(request, 0.0)
        sessions.finished(_ended_at_zero(key))  # its call ended at 0 s: in a tool gap since
        sessions.settled(key)
        memory.put(SessionKv(key, "m", 1000, 20 * GB, KvLocation.HBM, 0.0, pins=1))
        holds.table.add(Hold(key, "m", 0.0, 0.0, 1.0 + n, 1e6, pinned_bytes=20 * GB))
    return holds, memory


def test_make_room_releases_what_yields_until_the_call_fits_and_unpins_its_kv() -> None:
    holds, memory = _holds_of({"a1": "a", "a2": "a", "a3": "a", "a4": "a"})
    call = CallRequest("b1", "b1", "m", 1000, 10, tenant="b")
    freed: list[str] = []

    def fits() -> bool:  # room for 40 GB once two holds are gone
        freed[:] = [k for k, e in memory.kv.items() if not e.pinned]
        return len(freed) >= 2

    assert holds.make_room(call, fits, now_s=0.5)
    # a holds 80 GB against a cap of 50: a4 then a3 (the latest expected back) yield
    assert sorted(freed) == ["a3", "a4"] and set(holds.table.live) == {"a1", "a2"}
    assert holds.table.released[ReleaseReason.OVER_SHARE] == 2
    assert holds.table.released[ReleaseReason.STALE] == 0


def test_make_room_releases_nothing_for_the_tenants_own_call_or_when_nothing_yields() -> None:
    holds, memory = _holds_of({"a1": "a", "a2": "a"})
    own = CallRequest("a9", "a9", "m", 1000, 10, tenant="a")
    assert not holds.make_room(own, lambda: False, now_s=100.0)
    other = CallRequest("b1", "b1", "m", 1000, 10, tenant="b")
    assert not holds.make_room(other, lambda: False, now_s=0.5)  # within a's half, fresh
    assert set(holds.table.live) == {"a1", "a2"} and all(e.pinned for e in memory.kv.values())
    assert holds.make_room(other, lambda: not memory.kv["a1"].pinned, now_s=13.0)  # stale
    assert set(holds.table.live) == {"a2"}
    assert holds.table.released[ReleaseReason.STALE] == 1
