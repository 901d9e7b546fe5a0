"""core/placement/table.py: which nodes a call may go to while models arrive and drain."""

from __future__ import annotations

from talaria.core.placement import PlacementTable


def test_candidates_follow_receiving_serving_and_draining() -> None:
    table = PlacementTable({"n0": ["a"], "n1": ["b"]}, drain_s=100.0)
    assert table.candidates("a", None, 0.0) == ["n0"]
    table.receive("n1", "a", ready_s=50.0, now_s=0.0)
    assert table.candidates("a", None, 10.0) == ["n0"]  # not routed to before it arrives
    assert table.hosts("a") == ["n0", "n1"]
    table.ready("n1", "a")
    table.drain("n0", "a", now_s=60.0)
    assert table.candidates("a", None, 70.0) == ["n1"]  # a new session: not the draining node
    assert table.candidates("a", "n0", 70.0) == ["n1", "n0"]  # its own sessions stay
    assert table.candidates("a", "n0", 160.0) == ["n1"]  # drain_s later they move
    table.remove("n0", "a")
    assert table.layout() == {"n0": (), "n1": ("a", "b")}


def test_a_draining_node_takes_new_sessions_while_no_other_node_serves_the_model() -> None:
    table = PlacementTable({"n0": ["a"], "n1": []}, drain_s=100.0)
    table.receive("n1", "a", ready_s=45.0, now_s=0.0)
    table.drain("n0", "a", now_s=0.0)  # a move: the new node is still receiving
    assert table.candidates("a", None, 10.0) == ["n0"]
    table.ready("n1", "a")
    assert table.candidates("a", None, 50.0) == ["n1"]
    table.expire("n0", "a")
    assert table.candidates("a", "n0", 50.0) == ["n1"]


def test_views_count_receiving_as_hosted_and_report_live_sessions() -> None:
    table = PlacementTable({"n0": ["a"], "n1": []})
    table.receive("n1", "b", ready_s=5.0, now_s=1.0)
    views = table.views({("n0", "a"): 3}, {"n0": 1e12}, {"n1": frozenset({"c"})})
    assert [sorted(v.hosted) for v in views] == [["a"], ["b"]]
    assert views[0].live == {"a": 3} and views[1].placed_s == {"b": 1.0}
    assert views[0].budget_bytes == 1e12 and views[1].budget_bytes == float("inf")
    assert views[0].too_small == frozenset() and views[1].too_small == {"c"}
