"""The console's signed cookie and CSRF tokens (proxy/console/auth.py), and the throttle of
failed sign-ins (proxy/console/throttle.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from talaria.proxy.console.auth import CONSOLE_LOGIN_S, ConsoleAuth
from talaria.proxy.console.throttle import MAX_FAILURES, WINDOW_S, SignIn, SignInThrottle

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
    assert auth.sign_in("a", "admin-token").ok
    for wrong in ("", "admin", "admin-token ", "ädmin-token"):
        assert auth.sign_in("b", wrong) == SignIn(False, None)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


TOKEN = "k7Qe-operator-token"


def test_five_failed_sign_ins_a_minute_then_a_wait_until_the_oldest_is_a_minute_old() -> None:
    clock = _Clock()
    throttle = SignInThrottle(clock=clock)
    for _ in range(MAX_FAILURES):
        assert throttle.attempt("10.0.0.1", "k7Qe-guess", TOKEN) == SignIn(False, None)
        clock.now += 2
    wait_s = int(WINDOW_S - 2 * MAX_FAILURES)
    assert throttle.attempt("10.0.0.1", "k7Qe-guess", TOKEN) == SignIn(False, wait_s)
    assert throttle.attempt("10.0.0.2", "guess", TOKEN) == SignIn(False, None)  # per address
    clock.now = 1000.0 + WINDOW_S + 2  # two failures left the window (the sixth counted)
    assert throttle.attempt("10.0.0.1", "guess", TOKEN) == SignIn(False, None)


@pytest.mark.parametrize(
    ("guesses", "right_token"),
    [
        ([], SignIn(True)),
        (["guess"] * MAX_FAILURES, SignIn(True)),  # a flood without the prefix: still in
        (["guess"] * 50, SignIn(True)),
        (["k7Q"] * 50, SignIn(True)),  # shorter than the prefix
        (["k7Qf-x"] * 50, SignIn(True)),  # one character off
        (["k7Qe-x"] * (MAX_FAILURES - 1), SignIn(True)),  # the operator's own typos
        (["k7Qe-x"] * MAX_FAILURES, SignIn(False, 60)),  # five with its prefix: held
        (["guess"] * 20 + ["k7Qe-x"] * MAX_FAILURES, SignIn(False, 60)),
    ],
)
def test_the_right_token_waits_only_behind_failures_with_its_prefix(
    guesses: list[str], right_token: SignIn
) -> None:
    throttle = SignInThrottle(clock=_Clock())
    for guess in guesses:
        assert not throttle.attempt("shared", guess, TOKEN).ok
    assert throttle.attempt("shared", TOKEN, TOKEN) == right_token


def test_a_success_forgets_only_the_failures_with_the_tokens_prefix() -> None:
    throttle = SignInThrottle(clock=_Clock())
    for _ in range(MAX_FAILURES - 1):
        throttle.attempt("a", "k7Qe-typo", TOKEN)
        throttle.attempt("a", "guess", TOKEN)
    assert throttle.attempt("a", TOKEN, TOKEN).ok
    for _ in range(MAX_FAILURES - 1):
        throttle.attempt("a", "k7Qe-typo", TOKEN)  # the typos were forgotten: 4 again
    assert throttle.attempt("a", TOKEN, TOKEN).ok
    assert throttle.attempt("a", "guess", TOKEN) == SignIn(False, None)  # its fifth
    assert throttle.attempt("a", "guess", TOKEN).retry_after_s is not None  # not forgotten


def test_the_table_of_addresses_is_bounded_least_recently_seen_out() -> None:
    throttle = SignInThrottle(max_failures=1, max_addresses=3, clock=_Clock())
    for address in ("a", "b", "c"):
        throttle.attempt(address, "guess", TOKEN)
    assert throttle.attempt("a", "guess", TOKEN).retry_after_s is not None  # "b" oldest now
    throttle.attempt("d", "guess", TOKEN)
    held = [throttle.attempt(x, "guess", TOKEN).retry_after_s is not None for x in "acdb"]
    assert held == [True, True, True, False]
