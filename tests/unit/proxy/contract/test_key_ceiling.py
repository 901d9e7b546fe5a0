"""What class a key's call is served in (``Caller.served``): the header's within the key's
ceiling; and what ``--max-priority`` a key may be given (``key_ceiling``)."""

from __future__ import annotations

import pytest

from talaria.core.types import Priority
from talaria.proxy.contract.calls import Caller, Share
from talaria.proxy.store.tenants import key_ceiling

HI, S, B = Priority.INTERACTIVE, Priority.STANDARD, Priority.BATCH

SERVED = [
    # (key's priority, its --max-priority, the header's class, served)
    (B, None, None, B),  # no header: the key's own
    (B, None, HI, B),  # a header may not raise it...
    (B, None, S, B),
    (S, None, B, B),  # ...but may lower it
    (S, None, HI, S),
    (HI, None, B, B),
    (HI, None, HI, HI),
    (B, HI, HI, HI),  # the operator granted interactive
    (B, HI, None, B),  # granted, not the default
    (B, S, HI, S),  # granted standard: interactive is served standard
    (B, S, S, S),
    (B, S, B, B),
    (S, S, HI, S),
]


@pytest.mark.parametrize(("own", "ceiling", "asked", "served"), SERVED)
def test_a_header_lowers_the_keys_class_never_raises_it_past_the_ceiling(
    own: Priority, ceiling: Priority | None, asked: Priority | None, served: Priority
) -> None:
    caller = Caller("t", Share(own, 2.0), max_priority=ceiling)
    assert caller.served(asked) is served
    assert caller.ceiling is (ceiling or own)


def test_open_mode_and_env_keys_are_standard_with_a_standard_ceiling() -> None:
    for caller in (Caller("local"), Caller("default")):
        assert [caller.served(p) for p in (None, HI, S, B)] == [S, S, S, B]


CEILINGS = [
    # (--priority, --max-priority, the ceiling stored, or the error's words)
    ("batch", None, None),
    ("batch", "Interactive", HI),
    ("batch", "standard", S),
    ("batch", "batch", B),
    ("standard", "batch", "below the key's own priority"),
    ("interactive", "standard", "below the key's own priority"),
    ("standard", "urgent", "unknown priority"),
]


@pytest.mark.parametrize(("own", "given", "expected"), CEILINGS)
def test_a_ceiling_is_a_class_at_least_as_high_as_the_keys_own(
    own: str, given: str | None, expected: Priority | str | None
) -> None:
    if isinstance(expected, str) and not isinstance(expected, Priority):
        with pytest.raises(ValueError, match=expected):
            key_ceiling(own, given)
    else:
        assert key_ceiling(own, given) is expected
