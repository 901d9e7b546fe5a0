"""The console's signed cookie and CSRF tokens (proxy/console/auth.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from talaria.proxy.console.auth import CONSOLE_LOGIN_S, ConsoleAuth

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
