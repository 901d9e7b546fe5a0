"""Who sent a request, as the proxy counts it: the connection's peer, or, when that peer is a
proxy the operator trusts (``TALARIA_TRUSTED_PROXIES``), the client it says it relayed.

Two things read the address: the throttle of failed sign-ins (proxy/console/throttle.py),
counted per address, and open mode's loopback rule (proxy/callpath/auth.py: with no API key,
only local callers are served). A client must not choose either.

``X-Forwarded-For`` is a list that each proxy on the way appends its own peer to,

    X-Forwarded-For: <what the client wrote>, <hop 1's peer>, …, <hop n-1's peer>

and hop n is the connection's peer. Only an entry that a trusted proxy appended is a fact;
everything left of those is whatever the client wrote. So the client is found from the
right (:func:`client_host`): start at the peer; while the address at hand is a trusted proxy,
step to the entry left of it; the first address that is not trusted is the client. An entry
that is not an address (``unknown``, garbage) ends the walk at the trusted hop that relayed it.
When every entry is trusted, the left-most one is the client: each was vouched for by the
trusted hop to its right. The left-most entry is otherwise never taken: a client can write
anything there (uvicorn's own ``proxy_headers``, on by default, trusted any loopback peer and so
let a client on the host, or behind a local proxy that appends, pick its address per request;
both servers turn it off: core/http_edge.py).

``X-Forwarded-Proto`` (the scheme the client used: the console's cookie is ``Secure`` over
https) is taken from a trusted peer only, its right-most value.

A request that carries forwarding headers from a peer that is *not* trusted is ``relayed``:
its peer is a proxy the operator did not name (or a client pretending to be one), so its
address says nothing about the caller, and open mode does not take a loopback peer that relays
for a local caller.

Pure: no I/O. Formats: RFC 7239 §5.2 for the ``Forwarded`` header's name (only its presence is
read); ``X-Forwarded-For``'s de facto format as nginx (``$proxy_add_x_forwarded_for``), HAProxy
(``option forwardfor``) and the cloud balancers write it: comma-separated addresses, IPv6 ones
optionally bracketed, optionally with a port.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

FORWARDED_FOR = b"x-forwarded-for"
FORWARDED_PROTO = b"x-forwarded-proto"
RELAY_HEADERS = frozenset({FORWARDED_FOR, FORWARDED_PROTO, b"forwarded", b"x-real-ip"})
"""Headers that say a request was relayed (lower case, as ASGI gives them)."""
SCHEMES = frozenset({"http", "https"})


def trusted_networks(values: Iterable[str]) -> tuple[IpNetwork, ...]:
    """The networks of ``TALARIA_TRUSTED_PROXIES``: each value an address (``10.0.0.7``,
    ``::1``) or a network (``10.0.0.0/8``); ``ValueError`` naming one that is neither."""
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"TALARIA_TRUSTED_PROXIES: {value!r} is not an IP address or network "
                "(e.g. 127.0.0.1, 10.0.0.0/8, fd00::/8)"
            ) from None
    return tuple(networks)


def parse_address(entry: str) -> IpAddress | None:
    """The address of one ``X-Forwarded-For`` entry (``1.2.3.4``, ``1.2.3.4:5678``, ``::1``,
    ``[::1]``, ``[::1]:80``); None for anything else."""
    text = entry.strip()
    port = ""
    if text.startswith("["):
        text, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":") if rest else ""
    elif text.count(":") == 1:  # IPv4 with a port (an IPv6 address has several colons)
        text, _, port = text.partition(":")
    if port and not port.isdigit():
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _trusted(address: IpAddress, networks: Sequence[IpNetwork]) -> bool:
    return any(address in network for network in networks)


def client_host(peer: str | None, forwarded_for: str, networks: Sequence[IpNetwork]) -> str | None:
    """The client's address (module docstring): ``peer`` unless it is trusted, else the
    right-most untrusted address of ``forwarded_for`` (the request's ``X-Forwarded-For``
    values joined by commas)."""
    current = parse_address(peer) if peer is not None else None
    if current is None or not _trusted(current, networks):
        return peer
    for entry in reversed([e for e in forwarded_for.split(",") if e.strip()]):
        left = parse_address(entry)
        if left is None:  # not an address: the trusted hop that relayed it is what we know
            break
        current = left
        if not _trusted(current, networks):
            break
    return str(current)


@dataclass(frozen=True)
class Peer:
    """Who sent a request: its client's ``host`` (None: unknown), the ``scheme`` it used, and
    whether an untrusted peer ``relayed`` it (module docstring)."""

    host: str | None
    scheme: str
    relayed: bool = False


def resolve(
    peer: str | None,
    scheme: str,
    headers: Iterable[tuple[bytes, bytes]],
    networks: Sequence[IpNetwork],
) -> Peer:
    """The request's :class:`Peer`, from the connection's ``peer`` and ``scheme`` and the
    request's raw ``headers`` (module docstring)."""
    forwarded: list[str] = []
    protos: list[str] = []
    relayed = False
    for name, value in headers:
        if name in RELAY_HEADERS:
            relayed = True
            if name == FORWARDED_FOR:
                forwarded.append(value.decode("latin-1"))
            elif name == FORWARDED_PROTO:
                protos.append(value.decode("latin-1"))
    if not relayed:
        return Peer(peer, scheme)
    address = parse_address(peer) if peer is not None else None
    if address is None or not _trusted(address, networks):
        return Peer(peer, scheme, relayed=True)
    proto = ",".join(protos).rsplit(",", 1)[-1].strip().lower()
    host = client_host(peer, ",".join(forwarded), networks)
    return Peer(host, proto if proto in SCHEMES else scheme)
