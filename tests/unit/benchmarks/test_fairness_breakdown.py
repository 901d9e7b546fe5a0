"""bench/fairness_breakdown.py sums a tenant's calls' parts from the replay's own results: on
the ``small`` preset (one tenant, ``default``) every call is counted, each part is non-negative,
the slot wait is part of the queue and the restoring calls' first-token seconds part of all;
another tenant's breakdown counts no call."""

from __future__ import annotations

from bench.fairness_breakdown import breakdown, outranked_drains
from talaria.core.catalog import load_catalog
from talaria.sim.presets import get_preset


def test_a_tenants_parts_come_from_its_own_calls() -> None:
    catalog = load_catalog([])
    preset = get_preset("small")
    sessions = preset.sessions(catalog, 0)
    row = breakdown(sessions, preset, catalog, "default", "talaria")
    assert row["calls"] == sum(s.num_calls for s in sessions)
    assert all(v >= 0 for v in row.values())
    assert row["queue_s"] >= row["slot_wait_s"]
    assert row["to_first_token_s"] >= row["restoring_s"]  # some calls' part of it
    assert (row["restoring_s"] > 0) == (row["restored_gb"] > 0)
    assert row["decode_s"] > 0
    none = breakdown(sessions, preset, catalog, "nobody", "talaria")
    assert none["calls"] == 0 and none["decode_s"] == 0
    assert none["switches"] == row["switches"]  # the same replay: the node's own figure
    assert row["outranked"] == 0 == row["drain_s"]  # one class: no slot closes for another


def test_the_drain_runs_from_an_outranked_close_to_the_next_switch() -> None:
    def slot(start: float, switch: float, end: float, close: str | None) -> dict[str, object]:
        return {"start_s": start, "switch_s": switch, "end_s": end, "close": close}

    timeline = [
        slot(0, 0, 50, "outranked"),  # closed at 50; the next switch began at 58 - 5 = 53
        slot(58, 5, 100, "quantum"),  # a quantum close: not counted
        slot(106, 6, 130, "outranked"),  # the next switch began at once
        slot(136, 6, 150, None),
    ]
    assert outranked_drains(timeline) == [3.0, 0.0]
