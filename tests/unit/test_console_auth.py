"""The console's signed cookie and CSRF tokens (proxy/console/auth.py), and the throttle of
failed sign-ins (proxy/console/throttle.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from talaria.proxy.console.auth import CONSOLE_LOGIN_S, ConsoleAuth
from talaria.proxy.console.throttle import MAX_FAILURES, WINDOW_S, SignInThrottle

NOW = 1_800_000_000.0


def _tamper(cookie: str, part: int, value: str) -> str:
    parts = cookie.split(".")
    parts[part] = value
    return ".".join(parts)


@pytest.mark.parametrize(
    ("name", "make", "valid"),
    [
        ("as issued", lambda c: c, True),
        ("absent", lambda c: None, False),
        ("empty", lambda c: "", False),
        ("not three parts", lambda c: c + ".x", False),
        ("expiry not a number", lambda c: _tamper(c, 0, "soon"), False),
        ("expiry moved later", lambda c: _tamper(c, 0, str(int(NOW) + 10**6)), False),
        ("another nonce", lambda c: _tamper(c, 1, "someone-else"), False),
        ("signature changed", lambda c: _tamper(c, 2, "0" * 64), False),
        ("signature not ASCII", lambda c: _tamper(c, 2, "é" * 64), False),
    ],
)
def test_only_the_issued_cookie_signs_in(
    name: str, make: Callable[[str], str | None], valid: bool
) -> None:
    auth = ConsoleAuth("admin-token")
    cookie, login = auth.issue(now=NOW)
    result = auth.check(make(cookie), now=NOW + 1)
    assert (result == login) is valid, name


def test_a_cookie_expires_and_another_token_does_not_accept_it() -> None:
    auth = ConsoleAuth("admin-token")
    cookie, _ = auth.issue(now=NOW)
    assert auth.check(cookie, now=NOW + CONSOLE_LOGIN_S - 1) is not None
    assert auth.check(cookie, now=NOW + CONSOLE_LOGIN_S) is None
    assert ConsoleAuth("rotated-token").check(cookie, now=NOW + 1) is None


def test_signing_out_revokes_only_that_login() -> None:
    auth = ConsoleAuth("admin-token")
    first, login = auth.issue(now=NOW)
    second, _ = auth.issue(now=NOW)
    auth.revoke(login, now=NOW + 1)
    assert auth.check(first, now=NOW + 2) is None
    assert auth.check(second, now=NOW + 2) is not None


def test_csrf_token_belongs_to_one_login() -> None:
    auth = ConsoleAuth("admin-token")
    _, login = auth.issue(now=NOW)
    _, other = auth.issue(now=NOW)
    token = auth.csrf_token(login)
    assert auth.csrf_ok(login, token)
    assert not auth.csrf_ok(other, token)
    assert not auth.csrf_ok(login, None)
    assert not auth.csrf_ok(login, token[:-1])
    assert not ConsoleAuth("rotated-token").csrf_ok(login, token)


def test_the_admin_token_is_compared_whole() -> None:
    auth = ConsoleAuth("admin-token")
    assert auth.token_matches("admin-token")
    for wrong in ("", "admin", "admin-token ", "ädmin-token"):
        assert not auth.token_matches(wrong)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_five_failed_sign_ins_a_minute_then_a_wait_until_the_oldest_is_a_minute_old() -> None:
    clock = _Clock()
    throttle = SignInThrottle(clock=clock)
    for _ in range(MAX_FAILURES):
        assert throttle.retry_after_s("10.0.0.1") is None
        throttle.failed("10.0.0.1")
        clock.now += 2
    assert throttle.retry_after_s("10.0.0.1") == WINDOW_S - 2 * MAX_FAILURES
    assert throttle.retry_after_s("10.0.0.2") is None  # per address
    clock.now = 1000.0 + WINDOW_S  # the first failure has left the window
    assert throttle.retry_after_s("10.0.0.1") is None
    throttle.failed("10.0.0.1")
    assert throttle.retry_after_s("10.0.0.1") == 2


def test_a_success_forgets_the_failures() -> None:
    throttle = SignInThrottle(clock=_Clock())
    for _ in range(MAX_FAILURES - 1):
        throttle.failed("a")
    throttle.succeeded("a")
    throttle.failed("a")
    assert throttle.retry_after_s("a") is None


def test_the_table_of_addresses_is_bounded_least_recently_seen_out() -> None:
    throttle = SignInThrottle(max_failures=1, max_addresses=3, clock=_Clock())
    for address in ("a", "b", "c"):
        throttle.failed(address)
    assert throttle.retry_after_s("a") is not None  # seen again: "b" is now the oldest
    throttle.failed("d")
    assert [throttle.retry_after_s(x) is not None for x in "abcd"] == [True, False, True, True]
