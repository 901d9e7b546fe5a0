"""proxy/cluster/trust.py: a peer's signed forward verifies; any change of what it signs, a
stale timestamp, a missing header, or no secret (a lone proxy) is refused."""

from __future__ import annotations

import dataclasses

import pytest

from talaria.proxy.cluster import trust
from talaria.proxy.contract.settings import MIN_SECRET_CHARS

SECRET = "s" * MIN_SECRET_CHARS
NOW = 1_767_225_600.0
FORWARD = trust.Forward("abc123", "http://10.0.0.1:8000", int(NOW), trust.body_digest(b"{}"))
TARGET = ("POST", "/v1/messages", "beta=true")


def _raw(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", b"Bearer k")] + [
        (k.encode(), v.encode("latin-1")) for k, v in headers.items()
    ]


def _verify(
    headers: dict[str, str],
    target: tuple[str, str, str] = TARGET,
    secret: str | None = SECRET,
    now: float = NOW,
) -> trust.Forward:
    found = trust.internal_headers(_raw(headers))
    return trust.verify(found, *target, secret, now)


def test_a_signed_forward_verifies() -> None:
    headers = trust.sign(SECRET, *TARGET, FORWARD)
    assert set(headers) == set(trust.INTERNAL)
    assert _verify(headers) == FORWARD
    assert _verify(headers, now=NOW + trust.MAX_AGE_S) == FORWARD  # at the edge of the window
    assert _verify(headers, now=NOW - trust.MAX_AGE_S) == FORWARD  # a clock a little behind


def test_a_clients_request_has_no_internal_headers() -> None:
    assert trust.internal_headers(_raw({"x-talaria-session-id": "s"})) == {}


@pytest.mark.parametrize(
    ("target", "secret"),
    [
        (("GET", "/v1/messages", "beta=true"), SECRET),
        (("POST", "/v1/chat/completions", "beta=true"), SECRET),
        (("POST", "/v1/messages", ""), SECRET),
        (TARGET, "t" * MIN_SECRET_CHARS),
    ],
    ids=["method", "path", "query", "secret"],
)
def test_another_target_or_secret_is_refused(target: tuple[str, str, str], secret: str) -> None:
    headers = trust.sign(SECRET, *TARGET, FORWARD)
    with pytest.raises(trust.ForgedForward, match="wrong x-talaria-signature"):
        _verify(headers, target, secret)


@pytest.mark.parametrize("field", ["request_id", "forwarded_by", "body_sha256"])
def test_a_changed_signed_field_is_refused(field: str) -> None:
    headers = trust.sign(SECRET, *TARGET, FORWARD)
    changed = dataclasses.replace(FORWARD, **{field: "ffff00"})
    forged = trust.sign("x" * MIN_SECRET_CHARS, *TARGET, changed)
    forged[trust.SIGNATURE] = headers[trust.SIGNATURE]  # the real signature, other fields
    with pytest.raises(trust.ForgedForward, match="wrong x-talaria-signature"):
        _verify(forged)


def test_a_stale_or_future_timestamp_is_refused() -> None:
    headers = trust.sign(SECRET, *TARGET, FORWARD)
    for now in (NOW + trust.MAX_AGE_S + 1, NOW - trust.MAX_AGE_S - 1):
        with pytest.raises(trust.ForgedForward, match="stale"):
            _verify(headers, now=now)


@pytest.mark.parametrize("missing", trust.INTERNAL)
def test_a_missing_internal_header_is_refused(missing: str) -> None:
    headers = trust.sign(SECRET, *TARGET, FORWARD)
    del headers[missing]
    with pytest.raises(trust.ForgedForward, match=f"{missing} is missing"):
        _verify(headers)


@pytest.mark.parametrize(
    ("name", "value"), [(trust.TIMESTAMP, "-5"), (trust.REQUEST_ID, "a b"), (trust.REQUEST_ID, "é")]
)
def test_malformed_values_are_refused(name: str, value: str) -> None:
    headers = trust.sign(SECRET, *TARGET, FORWARD)
    headers[name] = value
    with pytest.raises(trust.ForgedForward, match=f"bad {name}"):
        _verify(headers)


def test_a_lone_proxy_refuses_even_a_valid_signature() -> None:
    headers = trust.sign(SECRET, *TARGET, FORWARD)
    with pytest.raises(trust.ForgedForward, match="a client may not send it"):
        _verify(headers, secret=None)
