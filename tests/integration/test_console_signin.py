"""Guessing the admin token (issue 23, finding 6.1), through the real HTTP stack: failed
sign-ins on the console's form and wrong bearer tokens on /admin are throttled per address
(five a minute, then 429 with ``Retry-After``); the right token too only after five failures
that share its first four characters, so a guesser sharing the operator's address cannot lock
the operator out (issue 36). (A token shorter than 16 characters is refused at start:
tests/unit/cli/test_cli.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from talaria.proxy.console.throttle import MAX_FAILURES
from talaria.proxy.contract.settings import ProxySettings
from talaria.runtime.instant import InstantRuntime
from tests.integration.server import RunningProxy, running_proxy

ADMIN = "admin-secret-token"


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[RunningProxy]:
    cfg = ProxySettings(database_url=f"sqlite+aiosqlite:///{tmp_path}/c.db", admin_token=ADMIN)
    with running_proxy(cfg, runtimes=[InstantRuntime(("m",), output_tokens=1)]) as running:
        yield running


def _sign_in(http: httpx.Client, token: str) -> httpx.Response:
    return http.post("/console/login", data={"token": token})


def test_failed_sign_ins_are_throttled_but_never_lock_the_operator_out(
    proxy: RunningProxy,
) -> None:
    """A guesser's five wrong tokens a minute from the operator's own address (behind an
    ingress every client shares it) get 429 after the fifth; the operator's right token still
    signs in, on the form and as a bearer token (issue 36, finding 7)."""
    with httpx.Client(base_url=proxy.base_url, timeout=30) as http:
        for _ in range(MAX_FAILURES):
            assert _sign_in(http, "a guess of the token").status_code == 401
        refused = _sign_in(http, "another guess")
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert "Too many failed sign-ins" in refused.text
        assert "set-cookie" not in refused.headers
        signed_in = _sign_in(http, ADMIN)
        assert signed_in.status_code == 303 and "set-cookie" in signed_in.headers
        bearer = http.get("/admin/instances", headers={"authorization": f"Bearer {ADMIN}"})
        assert bearer.status_code == 200


def test_guesses_with_the_tokens_first_characters_hold_even_the_right_token(
    proxy: RunningProxy,
) -> None:
    """Only a guesser who knows the token's first four characters can make the right token
    wait, and then only for the window."""
    with httpx.Client(base_url=proxy.base_url, timeout=30) as http:
        for _ in range(MAX_FAILURES):
            assert _sign_in(http, ADMIN[:4] + "-guess").status_code == 401
        refused = _sign_in(http, ADMIN)
        assert refused.status_code == 429 and "set-cookie" not in refused.headers
        bearer = http.get("/admin/instances", headers={"authorization": f"Bearer {ADMIN}"})
        assert bearer.status_code == 429  # the same address, the same throttle


def test_wrong_bearer_tokens_are_throttled_too(proxy: RunningProxy) -> None:
    with httpx.Client(base_url=proxy.base_url, timeout=30) as http:
        for _ in range(MAX_FAILURES):
            wrong = http.get("/admin/sessions", headers={"authorization": "Bearer guess"})
            assert wrong.status_code == 401
        refused = http.get("/admin/sessions", headers={"authorization": "Bearer guess 2"})
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "too_many_sign_ins"
        assert _sign_in(http, "guess 3").status_code == 429
        right = http.get("/admin/sessions", headers={"authorization": f"Bearer {ADMIN}"})
        assert right.status_code == 200


def test_a_right_token_before_the_limit_signs_in_and_forgets_the_operators_typos(
    proxy: RunningProxy,
) -> None:
    typo = ADMIN[:-1] + "x"
    with httpx.Client(base_url=proxy.base_url, timeout=30) as http:
        for _ in range(MAX_FAILURES - 1):
            assert _sign_in(http, typo).status_code == 401
        assert _sign_in(http, ADMIN).status_code == 303
        for _ in range(MAX_FAILURES - 1):
            assert _sign_in(http, typo).status_code == 401
        assert _sign_in(http, ADMIN).status_code == 303
