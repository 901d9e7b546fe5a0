"""Sign-in for the operator console: a signed cookie, no server-side session table.

Signing in with the admin token (``TALARIA_ADMIN_TOKEN``) sets the cookie

    talaria_console = <expires>.<nonce>.<sig>
    sig = HMAC-SHA256(admin_token, "console|expires|nonce")

HttpOnly (scripts cannot read it), SameSite=Strict (no other site's page sends it), Secure
when the console is reached over HTTPS, Path=/ (the console's data comes from /admin). Any
replica with the same admin token accepts it, and changing the token signs everyone out.
The token itself never leaves the sign-in form: not in a URL, not in the cookie.

Requests that change something (ending a session, signing out) must also carry the CSRF
token ``HMAC-SHA256(admin_token, "csrf|nonce")`` (hex), which the console page embeds and
sends back in the ``x-csrf-token`` header (or the ``csrf`` form field): another site can make
a browser send the cookie on a top-level form post in some browsers, never this value.

Signing out revokes the cookie's nonce in this process (a copy of the cookie stops working
here at once; on other replicas at its expiry, ``CONSOLE_LOGIN_S``).

Failed sign-ins (the form, or a wrong bearer token on /admin) are throttled per address
(proxy/console/throttle.py): five a minute, then 429 — for the right token too only when five
failed with its first four characters, so a guesser cannot lock the operator out.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from talaria.proxy.console.throttle import SignIn, SignInThrottle

COOKIE = "talaria_console"
CONSOLE_LOGIN_S = 8 * 3600
"""How long a sign-in lasts (seconds)."""
MAX_REVOKED = 10_000


@dataclass(frozen=True)
class ConsoleLogin:
    """A valid console cookie: its nonce and when it expires (Unix seconds)."""

    nonce: str
    expires_at: int


def _sign(key: str, message: str) -> str:
    return hmac.new(key.encode(), message.encode(), hashlib.sha256).hexdigest()


class ConsoleAuth:
    """Issues and checks console cookies and CSRF tokens for one admin token."""

    def __init__(self, admin_token: str, *, login_s: int = CONSOLE_LOGIN_S) -> None:
        self._token = admin_token
        self._login_s = login_s
        self._revoked: dict[str, int] = {}  # nonce → expiry, until it would have expired anyway
        self.throttle = SignInThrottle()

    @property
    def login_s(self) -> int:
        """How long a sign-in lasts, seconds (the cookie's max-age)."""
        return self._login_s

    def sign_in(self, address: str, given: str) -> SignIn:
        """Whether ``given`` from ``address`` is the admin token, throttled (throttle.py)."""
        return self.throttle.attempt(address, given, self._token)

    def issue(self, now: float | None = None) -> tuple[str, ConsoleLogin]:
        """A new cookie value and the login it stands for."""
        expires = int(now if now is not None else time.time()) + self._login_s
        nonce = secrets.token_urlsafe(18)
        sig = _sign(self._token, f"console|{expires}|{nonce}")
        return f"{expires}.{nonce}.{sig}", ConsoleLogin(nonce, expires)

    def check(self, cookie: str | None, now: float | None = None) -> ConsoleLogin | None:
        """The login a cookie proves, or None (absent, forged, expired or signed out)."""
        if not cookie:
            return None
        parts = cookie.split(".")
        if len(parts) != 3 or not parts[0].isdigit():
            return None
        expires_text, nonce, sig = parts
        expected = _sign(self._token, f"console|{expires_text}|{nonce}")
        if not hmac.compare_digest(sig.encode(), expected.encode()):
            return None
        expires = int(expires_text)
        if expires <= (now if now is not None else time.time()) or nonce in self._revoked:
            return None
        return ConsoleLogin(nonce, expires)

    def csrf_token(self, login: ConsoleLogin) -> str:
        """The login's CSRF token: hex HMAC-SHA256(admin_token, "csrf|nonce")."""
        return _sign(self._token, f"csrf|{login.nonce}")

    def csrf_ok(self, login: ConsoleLogin, given: str | None) -> bool:
        """Whether ``given`` is the login's CSRF token (constant time; None never is)."""
        return given is not None and hmac.compare_digest(
            given.encode(), self.csrf_token(login).encode()
        )

    def revoke(self, login: ConsoleLogin, now: float | None = None) -> None:
        """Sign ``login`` out in this process."""
        clock = now if now is not None else time.time()
        if len(self._revoked) >= MAX_REVOKED:
            self._revoked = {n: e for n, e in self._revoked.items() if e > clock}
        self._revoked[login.nonce] = login.expires_at
