"""The client's address behind trusted proxies (proxy/contract/peer.py): the right-most hop of
``X-Forwarded-For`` that is not a trusted proxy, never the client-written left-most one."""

from __future__ import annotations

import pytest

from talaria.proxy.contract.peer import Peer, client_host, parse_address, resolve, trusted_networks
from talaria.proxy.contract.settings import ProxySettings

LOCAL = trusted_networks(["127.0.0.1", "::1"])
CLUSTER = trusted_networks(["127.0.0.1", "10.0.0.0/8"])


@pytest.mark.parametrize(
    ("peer", "forwarded_for", "networks", "client"),
    [
        ("203.0.113.5", "198.51.100.1", LOCAL, "203.0.113.5"),  # an untrusted peer: itself
        ("127.0.0.1", "198.51.100.1", (), "127.0.0.1"),  # nothing trusted: the peer
        ("127.0.0.1", "198.51.100.1", LOCAL, "198.51.100.1"),
        ("127.0.0.1", "6.6.6.6, 198.51.100.1", LOCAL, "198.51.100.1"),  # not the left-most
        ("127.0.0.1", "6.6.6.6, 198.51.100.1, 10.0.0.9", CLUSTER, "198.51.100.1"),
        ("127.0.0.1", "6.6.6.6, 198.51.100.1, 10.0.0.9", LOCAL, "10.0.0.9"),
        ("127.0.0.1", "10.0.0.1, 10.0.0.2", CLUSTER, "10.0.0.1"),  # all trusted: vouched for
        ("127.0.0.1", "", LOCAL, "127.0.0.1"),  # nothing relayed: the proxy's own request
        ("127.0.0.1", "unknown", LOCAL, "127.0.0.1"),  # not an address: its relay
        ("127.0.0.1", "198.51.100.1, garbage, 10.0.0.9", CLUSTER, "10.0.0.9"),
        ("127.0.0.1", "198.51.100.1:4711", LOCAL, "198.51.100.1"),  # with a port
        ("::1", "[2001:db8::1]:443", LOCAL, "2001:db8::1"),
        ("::1", "2001:db8::2", LOCAL, "2001:db8::2"),
        (None, "198.51.100.1", LOCAL, None),  # no peer (a unix socket): unknown
    ],
)
def test_the_client_is_the_right_most_untrusted_hop(
    peer: str | None, forwarded_for: str, networks: tuple, client: str | None
) -> None:
    assert client_host(peer, forwarded_for, networks) == client


@pytest.mark.parametrize(
    ("entry", "address"),
    [("1.2.3.4", "1.2.3.4"), (" 1.2.3.4:80 ", "1.2.3.4"), ("[::1]", "::1"), ("::1", "::1"),
     ("[::1]:8080", "::1"), ("unknown", None), ("", None), ("1.2.3.4:x", None)],
)  # fmt: skip
def test_entries_parse_as_addresses_or_not_at_all(entry: str, address: str | None) -> None:
    parsed = parse_address(entry)
    assert (str(parsed) if parsed is not None else None) == address


def _headers(**values: str) -> list[tuple[bytes, bytes]]:
    return [(k.replace("_", "-").encode(), v.encode()) for k, v in values.items()]


@pytest.mark.parametrize(
    ("peer", "headers", "networks", "expected"),
    [
        ("127.0.0.1", {}, LOCAL, Peer("127.0.0.1", "http")),
        ("127.0.0.1", {"x_forwarded_for": "1.2.3.4"}, (), Peer("127.0.0.1", "http", True)),
        ("127.0.0.1", {"forwarded": "for=1.2.3.4"}, (), Peer("127.0.0.1", "http", True)),
        ("127.0.0.1", {"x_real_ip": "1.2.3.4"}, (), Peer("127.0.0.1", "http", True)),
        ("127.0.0.1", {"x_forwarded_proto": "https"}, (), Peer("127.0.0.1", "http", True)),
        (
            "127.0.0.1",
            {"x_forwarded_for": "1.2.3.4", "x_forwarded_proto": "http, HTTPS"},
            LOCAL,
            Peer("1.2.3.4", "https"),
        ),
        ("127.0.0.1", {"x_forwarded_proto": "gopher"}, LOCAL, Peer("127.0.0.1", "http")),
    ],
    ids=["plain", "untrusted-xff", "untrusted-forwarded", "untrusted-real-ip",
         "untrusted-proto", "trusted", "bad-proto"],
)  # fmt: skip
def test_resolve_trusts_the_headers_of_trusted_peers_only(
    peer: str, headers: dict[str, str], networks: tuple, expected: Peer
) -> None:
    assert resolve(peer, "http", _headers(**headers), networks) == expected


def test_a_setting_that_is_not_an_address_stops_the_proxy_naming_it() -> None:
    assert ProxySettings(trusted_proxies="127.0.0.1, 10.0.0.0/8").trusted_proxies == [
        "127.0.0.1",
        "10.0.0.0/8",
    ]
    assert ProxySettings().trusted_proxies == []
    with pytest.raises(ValueError, match=r"'proxy\.example' is not an IP address"):
        ProxySettings(trusted_proxies="127.0.0.1,proxy.example")
