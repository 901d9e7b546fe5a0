"""The proxy-level soft-reservation book (``core.preferences.SessionPreferences``), shared by
the gateway and the simulator's cluster replay: when it reserves, for how long, how a
reservation ends, and the gaps it learns. Tables of cases, then a hypothesis property test
against a small model of the rules.

Numbers: prior gap 3.2 s (weight 1); expiry ``now + max(2 × gap, gap + 1 s)``, live up to and
including that instant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talaria.core.gap_model import DEFAULT_GAP_PRIOR_S
from talaria.core.preferences import RoutePreference, SessionPreferences, Settled
from talaria.proxy.contract.identity import Identity
from talaria.proxy.sessions.book import SessionBook
from talaria.proxy.sessions.conversation import EMPTY
from talaria.proxy.sessions.resolve import resolve


def _hold_s(gap_s: float) -> float:
    return max(2.0 * gap_s, gap_s + 1.0)


# -- when it reserves --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("final", "asks_tools", "hint_s", "expected_gap_s"),
    [
        (False, True, None, DEFAULT_GAP_PRIOR_S),  # a tool call: the learned gap (the prior)
        (False, False, 2.0, 2.0),  # no tool call, but a hint: reserved for the hint
        (False, True, 2.0, 2.0),  # both: the hint wins over the learned gap
        (False, True, 0.0, 0.0),  # a zero hint is a hint
        (False, False, None, None),  # a plain reply: nothing reserved
        (True, True, None, None),  # the session's last call: nothing reserved
        (True, False, 5.0, None),  # ... even with a hint
    ],
)
def test_when_a_finished_call_reserves(
    final: bool, asks_tools: bool, hint_s: float | None, expected_gap_s: float | None
) -> None:
    book = SessionPreferences()
    taken = book.finished("s", "a", 10.0, final=final, asks_tools=asks_tools, hint_s=hint_s)
    if expected_gap_s is None:
        assert taken is None and book.held("s") is None and book.reserved("s", 10.0) is None
    else:
        assert taken is not None and (taken.session, taken.instance) == ("s", "a")
        assert taken.created_s == 10.0 and taken.expected_gap_s == pytest.approx(expected_gap_s)
        assert taken.expires_s == pytest.approx(10.0 + _hold_s(expected_gap_s))
        assert book.held("s") == taken and book.reserved("s", 10.0) == "a"
    assert ("s" in book) is not final  # a last call forgets the session


def test_a_plain_reply_leaves_the_reservation_as_it_is_and_a_new_one_replaces_it() -> None:
    book = SessionPreferences()
    first = book.finished("s", "a", 0.0, final=False, asks_tools=True)
    assert book.finished("s", "b", 1.0, final=False, asks_tools=False) is None
    assert book.held("s") == first
    second = book.finished("s", "b", 2.0, final=False, asks_tools=True)
    assert second is not None and book.held("s") == second and book.reserved("s", 2.0) == "b"


# -- expected gap: hint vs learned -------------------------------------------------------------
@pytest.mark.parametrize(
    ("observed_s", "hint_s", "expected_gap_s"),
    [
        ([], None, DEFAULT_GAP_PRIOR_S),
        ([0.5], None, (DEFAULT_GAP_PRIOR_S + 0.5) / 2),
        ([1.0, 4.0], None, (DEFAULT_GAP_PRIOR_S + 5.0) / 3),
        ([1.0, 4.0], 30.0, 30.0),  # a hint replaces what was learned, for this reservation
        ([-2.0], None, DEFAULT_GAP_PRIOR_S / 2),  # a negative gap counts as 0
    ],
)
def test_the_expected_gap_is_the_hint_else_the_learned_mean(
    observed_s: list[float], hint_s: float | None, expected_gap_s: float
) -> None:
    book = SessionPreferences()
    now = 100.0
    for gap in observed_s:
        book.finished("s", "a", now, final=False, asks_tools=True)
        book.started("s", "a", now + gap)  # a negative gap: the caller's clocks disagree
        now += max(gap, 0.0) + 1.0
    taken = book.finished("s", "a", now, final=False, asks_tools=True, hint_s=hint_s)
    assert taken is not None
    assert taken.expected_gap_s == pytest.approx(expected_gap_s)
    assert taken.expected_return_s == pytest.approx(now + expected_gap_s)
    assert taken.expires_s == pytest.approx(now + _hold_s(expected_gap_s))
    learned = (DEFAULT_GAP_PRIOR_S + sum(max(0.0, g) for g in observed_s)) / (1 + len(observed_s))
    assert book.expected_gap_s("s") == pytest.approx(learned)  # hints are not learned


def test_a_gap_is_learned_once_per_finish_and_never_while_another_call_is_in_flight() -> None:
    book = SessionPreferences()
    book.finished("s", "a", 0.0, final=False, asks_tools=True)
    book.started("s", "a", 2.0, concurrent=True)  # a parallel call: no tool gap
    assert book.expected_gap_s("s") == DEFAULT_GAP_PRIOR_S
    book.finished("s", "a", 3.0, final=False, asks_tools=True)
    book.started("s", "a", 5.0)  # 2 s after the last finish
    book.started("s", "a", 9.0)  # no finish since: nothing new to learn
    assert book.expected_gap_s("s") == pytest.approx((DEFAULT_GAP_PRIOR_S + 2.0) / 2)


def test_the_reservation_book_scenario() -> None:
    """The scenario of the replay's former reservation book, under the one book's rules."""
    book = SessionPreferences()
    book.finished("s", "a", 10.0, final=False, asks_tools=True)
    # prior gap 3.2 s: expires at 10 + max(2 × 3.2, 3.2 + 1) = 16.4, live through 16.4
    assert book.reserved("s", 16.39) == "a"
    assert book.reserved("s", 16.4) == "a"
    assert book.reserved("s", 16.41) is None
    book.finished("s", "a", 20.0, final=False, asks_tools=True)
    assert book.started("s", "a", 30.0) is Settled.EXPIRED  # back after 10 s: gap learned
    assert book.reserved("s", 30.0) is None
    book.finished("s", "b", 31.0, final=False, asks_tools=True)
    # the 10 → 20 gap was never a started call: mean (3.2 + 10) / 2 = 6.6, hold 13.2 s
    assert book.reserved("s", 44.19) == "b"
    assert book.reserved("s", 44.21) is None
    book.finished("s", "b", 50.0, final=True, asks_tools=False)
    assert book.reserved("s", 50.0) is None and "s" not in book and len(book) == 0


# -- expiry boundary ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("hint_s", "expires_s"),
    [
        (3.2, 16.4),  # 2 × gap wins: 10 + 6.4
        (1.0, 12.0),  # equal: 2 × 1 = 1 + 1
        (0.5, 11.5),  # gap + 1 s wins
        (0.0, 11.0),  # a zero gap still holds for 1 s
    ],
)
def test_a_reservation_is_live_up_to_and_including_its_expiry(
    hint_s: float, expires_s: float
) -> None:
    book = SessionPreferences()
    taken = book.finished("s", "a", 10.0, final=False, asks_tools=True, hint_s=hint_s)
    assert taken is not None and taken.expires_s == pytest.approx(expires_s)
    exact = taken.expires_s
    assert book.reserved("s", exact) == "a"
    assert book.reserved("s", exact + 1e-9) is None
    assert book.held("s") == taken  # reading never releases
    assert book.sweep(exact) == []
    assert book.sweep(exact + 1e-9) == [taken]
    assert book.held("s") is None


# -- settling when the session is back ---------------------------------------------------------
@pytest.mark.parametrize(
    ("back_s", "routed_to", "outcome"),
    [
        (11.0, "a", Settled.HIT),
        (11.0, "b", Settled.MISS),
        (16.4, "a", Settled.HIT),  # at the expiry instant: still live
        (16.5, "a", Settled.EXPIRED),
        (16.5, "b", Settled.EXPIRED),
    ],
)
def test_the_next_call_settles_the_reservation(
    back_s: float, routed_to: str, outcome: Settled
) -> None:
    book = SessionPreferences()
    book.finished("s", "a", 10.0, final=False, asks_tools=True)  # expires at 16.4
    assert book.started("s", routed_to, back_s) is outcome
    assert book.held("s") is None and book.reserved("s", back_s) is None
    assert book.started("s", routed_to, back_s) is None  # settled once


def test_a_call_with_no_reservation_settles_nothing() -> None:
    book = SessionPreferences()
    assert book.started("new", "a", 0.0) is None and "new" not in book
    book.finished("s", "a", 1.0, final=False, asks_tools=False)
    assert book.started("s", "a", 2.0) is None


def test_a_swept_reservation_is_not_settled_again() -> None:
    book = SessionPreferences()
    book.finished("s", "a", 10.0, final=False, asks_tools=True, hint_s=1.0)  # expires at 12
    assert [h.session for h in book.sweep(13.0)] == ["s"]
    assert book.started("s", "a", 14.0) is None


# -- hints -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("setup", "concurrent", "instance"),
    [
        ("finished-on-b", False, "b"),  # reserves on the session's last instance
        ("finished-on-b", True, None),  # a call in flight: its end decides
        ("unknown", False, None),  # the book knows no last instance
        ("adopted-on-c", False, "c"),  # taken over from another replica: its last instance
        ("adopted-unknown", False, None),
        ("ended", False, None),
    ],
)
def test_a_hint_reserves_on_the_last_instance(
    setup: str, concurrent: bool, instance: str | None
) -> None:
    book = SessionPreferences()
    if setup in ("finished-on-b", "ended"):
        book.finished("s", "b", 0.0, final=False, asks_tools=False)
    if setup == "ended":
        book.end("s")
    if setup == "adopted-on-c":
        book.adopt("s", "c")
    if setup == "adopted-unknown":
        book.adopt("s", None)
    taken = book.hint("s", 5.0, 2.0, concurrent=concurrent)
    if instance is None:
        assert taken is None and book.reserved("s", 5.0) is None
    else:
        assert taken == RoutePreference("s", instance, 5.0, 2.0, 9.0)
        assert book.reserved("s", 9.0) == instance and book.reserved("s", 9.1) is None


def test_a_hint_replaces_the_reservation_and_adopt_keeps_what_the_book_knows() -> None:
    book = SessionPreferences()
    book.finished("s", "a", 0.0, final=False, asks_tools=True)
    book.adopt("s", "z")  # the book saw its last call: that instance stays
    taken = book.hint("s", 1.0, 10.0)
    assert taken is not None and taken.instance == "a" and taken.expires_s == 21.0
    assert book.held("s") == taken


# -- sweeping and ending -----------------------------------------------------------------------
def test_sweep_releases_exactly_the_expired_ones_by_expiry() -> None:
    book = SessionPreferences()
    for session, hint in (("late", 5.0), ("s2", 1.0), ("s1", 1.0), ("gone", 0.0)):
        book.finished(session, "a", 0.0, final=False, asks_tools=True, hint_s=hint)
    # expiries: late 10, s1 2, s2 2, gone 1
    assert book.sweep(0.5) == []
    assert [h.session for h in book.sweep(3.0)] == ["gone", "s1", "s2"]
    assert book.reserved("late", 3.0) == "a"
    assert [h.session for h in book.sweep(3.0)] == []
    assert all(s in book for s in ("late", "s1", "s2", "gone"))  # gaps are kept
    assert [h.session for h in book.sweep(11.0)] == ["late"]


def test_end_forgets_the_session_and_returns_its_reservation() -> None:
    book = SessionPreferences()
    taken = book.finished("s", "a", 0.0, final=False, asks_tools=True)
    book.started("t", "a", 0.0)
    assert book.end("s") == taken
    assert "s" not in book and book.reserved("s", 0.0) is None
    assert book.expected_gap_s("s") == DEFAULT_GAP_PRIOR_S
    assert book.end("s") is None and book.end("never") is None


def test_the_gateways_session_book_takes_a_forgotten_sessions_reservations_with_it() -> None:
    """``SessionBook(on_forget=book.end)``, as the gateway builds it: a session ended, handed
    off or evicted (least recently used, beyond capacity) leaves nothing in the book."""
    book = SessionPreferences()
    sessions = SessionBook(capacity=2, on_forget=book.end)
    now_at = datetime.now(UTC)

    def open_session(name: str) -> str:
        found = resolve(
            sessions,
            tenant_id="t",
            identity=Identity(name, "talaria"),
            model="m",
            conversation=EMPTY,
            now_s=0.0,
            now_at=now_at,
            match=False,
        )
        book.finished(found.state.key, "a", 0.0, final=False, asks_tools=True)
        return found.state.key

    first, second = open_session("one"), open_session("two")
    assert first in book and second in book
    open_session("three")  # beyond capacity: "one" is evicted
    assert first not in book and book.reserved(first, 0.0) is None
    state = sessions.get(second)
    assert state is not None
    sessions.forget(state)  # ended or handed off
    assert second not in book and len(book) == 1


# -- property: a random life of a few sessions -------------------------------------------------
SESSIONS = ("s", "t", "u")
INSTANCES = ("a", "b")
steps = st.floats(0.0, 8.0, allow_nan=False)
gaps = st.one_of(st.none(), st.floats(0.0, 6.0, allow_nan=False))

events = st.one_of(
    st.tuples(
        st.just("start"), st.sampled_from(SESSIONS), st.sampled_from(INSTANCES), steps,
        st.booleans(),
    ),
    st.tuples(
        st.just("finish"), st.sampled_from(SESSIONS), st.sampled_from(INSTANCES), steps,
        st.booleans(), st.booleans(), gaps,
    ),
    st.tuples(
        st.just("hint"), st.sampled_from(SESSIONS), steps, st.floats(0.0, 6.0), st.booleans()
    ),
    st.tuples(st.just("sweep"), steps),
    st.tuples(st.just("end"), st.sampled_from(SESSIONS)),
    st.tuples(st.just("read"), st.sampled_from(SESSIONS), steps),
)  # fmt: skip


@dataclass
class _Model:
    """What the rules say each session holds: (instance, expiry) and its last instance."""

    held: dict[str, tuple[str, float]] = field(default_factory=dict)
    last: dict[str, str] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=40))
def test_random_lives_never_show_an_expired_or_ended_reservation(
    script: list[tuple[object, ...]],
) -> None:
    book, model, now = SessionPreferences(), _Model(), 0.0

    def check() -> None:
        for s in SESSIONS:
            found = book.reserved(s, now)
            held = book.held(s)
            if found is not None:  # readable ⇒ not past its expiry
                assert held is not None and found == held.instance and now <= held.expires_s
            if held is not None:
                assert held.expires_s == pytest.approx(
                    held.created_s + _hold_s(held.expected_gap_s)
                )
                assert held.created_s <= now and held.expected_gap_s >= 0
                assert (held.instance, held.expires_s) == model.held[s]
            else:
                assert s not in model.held
            if s in model.ended:
                assert held is None and found is None and s not in book

    for event in script:
        kind = event[0]
        if kind == "start":
            _, s, inst, dt, concurrent = event
            now += dt
            before = model.held.pop(s, None)
            outcome = book.started(s, inst, now, concurrent=concurrent)
            if before is None:
                assert outcome is None
            elif now > before[1]:
                assert outcome is Settled.EXPIRED
            else:
                assert outcome is (Settled.HIT if before[0] == inst else Settled.MISS)
        elif kind == "finish":
            _, s, inst, dt, final, asks_tools, hint = event
            now += dt
            taken = book.finished(s, inst, now, final=final, asks_tools=asks_tools, hint_s=hint)
            if final:
                assert taken is None
                model.held.pop(s, None)
                model.last.pop(s, None)
                model.ended.add(s)
            else:
                model.ended.discard(s)
                model.last[s] = inst
                if asks_tools or hint is not None:
                    assert taken is not None and taken.instance == inst
                    if hint is not None:
                        assert taken.expected_gap_s == hint
                    model.held[s] = (inst, taken.expires_s)
                else:
                    assert taken is None
        elif kind == "hint":
            _, s, dt, gap, concurrent = event
            now += dt
            taken = book.hint(s, now, gap, concurrent=concurrent)
            if s in model.last and not concurrent:
                assert taken is not None and taken.instance == model.last[s]
                assert taken.expires_s == pytest.approx(now + _hold_s(gap))
                model.held[s] = (taken.instance, taken.expires_s)
            else:
                assert taken is None
        elif kind == "sweep":
            now += event[1]
            swept = book.sweep(now)
            expected = {s for s, (_, expires) in model.held.items() if now > expires}
            assert {h.session for h in swept} == expected
            for s in expected:
                del model.held[s]
            assert all(book.reserved(s, now) is None for s in expected)
            assert all(h.live(now) for s in SESSIONS if (h := book.held(s)) is not None)
        elif kind == "end":
            s = event[1]
            assert isinstance(s, str)
            dropped = book.end(s)
            assert (dropped is None) is (s not in model.held)
            model.held.pop(s, None)
            model.last.pop(s, None)
            model.ended.add(s)
        else:
            _, s, dt = event
            assert isinstance(dt, float)
            now += dt
            book.reserved(str(s), now)
        check()
