"""Which replica owns a session (proxy/cluster/owner.py): every call of a session has one route
key, and rendezvous hashing moves only the keys of a replica that joins or leaves."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from talaria.proxy.cluster.owner import affinity, owner, placement_key, route_key
from talaria.proxy.sessions.identity import identify

SYSTEM = {"role": "system", "content": "You are a coding agent."}


def _conversation(first: str, turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": first}]
    for i in range(turns):
        messages.append({"role": "assistant", "content": f"step {i}"})
        messages.append({"role": "user", "content": f"result {i}"})
    return messages


@pytest.mark.parametrize(
    ("case", "a", "b", "same"),
    [
        ("every call of a conversation", ("t", None, 0), ("t", None, 5), True),
        ("another first message", ("t", None, 0), ("t", None, 0, "other task"), False),
        ("another tenant", ("t", None, 3), ("u", None, 3), False),
        ("an explicit id, whatever the messages", ("t", "s1", 0), ("t", "s1", 4, "x"), True),
        ("the same id in another tenant", ("t", "s1", 0), ("u", "s1", 0), False),
        ("an id or no id", ("t", "s1", 0), ("t", None, 0), False),
    ],
)
def test_route_keys(case: str, a: tuple[Any, ...], b: tuple[Any, ...], same: bool) -> None:
    def key(tenant: str, session: str | None, turns: int, first: str = "fix it") -> str | None:
        return route_key(tenant, session, _conversation(first, turns))

    assert (key(*a) == key(*b)) is same, case


def test_a_call_without_id_or_messages_keeps_no_session() -> None:
    assert route_key("t", None, None) is None
    assert route_key("t", None, []) is None


def test_system_messages_alone_make_a_key() -> None:
    assert route_key("t", None, [SYSTEM]) is not None


@given(
    keys=st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=50, unique=True),
    replicas=st.lists(
        st.text(alphabet="abcdefgh0123456789", min_size=1, max_size=8),
        min_size=2,
        max_size=6,
        unique=True,
    ),
)
def test_only_a_leaving_replicas_keys_move(keys: list[str], replicas: list[str]) -> None:
    before = {k: owner(k, replicas) for k in keys}
    gone = replicas[0]
    after = {k: owner(k, replicas[1:]) for k in keys}
    for k in keys:
        if before[k] != gone:
            assert after[k] == before[k]
        assert after[k] != gone


@given(
    keys=st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=50, unique=True),
    replicas=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=6, unique=True),
)
def test_the_owner_does_not_depend_on_the_order_replicas_are_listed(
    keys: list[str], replicas: list[str]
) -> None:
    for k in keys:
        assert owner(k, replicas) == owner(k, list(reversed(replicas)))


def test_keys_spread_evenly_over_replicas() -> None:
    counts = Counter(owner(f"id|t|session-{i}", ["r1", "r2", "r3"]) for i in range(3000))
    assert set(counts) == {"r1", "r2", "r3"}
    assert all(800 <= n <= 1200 for n in counts.values()), counts


@pytest.mark.parametrize(
    ("headers", "name"),
    [
        ({}, None),
        ({"x-session-id": "b"}, "b"),
        ({"x-talaria-session-id": "a", "x-session-id": "b"}, "a"),  # the higher rank wins
        ({"x-session-id": "b", "x-talaria-session-id": "a"}, "a"),  # whatever the order sent
        ({"x-talaria-session-id": "", "session-id": "c"}, "c"),  # an empty one is absent
        ({"thread-id": "t", "x-litellm-session-id": "l"}, "t"),
        ({"x-dynamo-session-id": "d"}, "d"),
    ],
)
def test_the_balancers_name_for_a_session_is_its_first_ranked_header(
    headers: dict[str, str], name: str | None
) -> None:
    assert affinity(headers) == name
    if name is not None:  # the proxy names the session the same (no body field outranks)
        assert identify(headers, {}).session_id == name


def test_varying_a_lower_ranked_header_keeps_the_placement_key() -> None:
    keys = {
        placement_key(
            "t", "a", None, {"x-talaria-session-id": "a", "x-session-id": v}, ingress=True
        )
        for v in ("1", "2", "3")
    }
    assert keys == {"ingress|t|a"}
