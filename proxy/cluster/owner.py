"""Which replica owns a session: pure functions, no I/O.

The *route key* names a session before any replica has resolved it:

- an explicit session id (header, ``prompt_cache_key``, ...): ``id|tenant|session id``;
- otherwise its conversation's root: ``root|tenant|blake2b(d_1 ‖ … ‖ d_k)`` over the message
  fingerprints (proxy/sessions/conversation.py) up to and including the first message that is
  not a system message. Every call of a session resends that prefix, so they all share the
  key; a sub-agent with its own first message gets its own;
- a call with neither (a text completion without an id) has no session to keep: None, served
  where it lands.

The owner is the replica of highest weight (rendezvous hashing):

    owner(key) = argmax over replicas r of  int(blake2b_8(key ‖ "|" ‖ r))

(blake2b with an 8-byte digest, read as a big-endian integer; ties broken by name)

so when a replica joins or leaves, only the keys it wins or held move (about 1/N of them),
and every replica that sees the same live set picks the same owner.

*Ingress affinity* (``TALARIA_REPLICA_AFFINITY=ingress``): the balancer in front of the
replicas hashes each call on its session's name — the value of the first of
``AFFINITY_HEADERS`` (the proxy's own ranked session headers, proxy/sessions/identity.py)
that the call carries, as :func:`affinity` and the nginx maps of :func:`nginx_session_maps`
(deploy/nginx/talaria.conf) take it — and so sends a session's calls to one replica in the
first place, whatever lower-ranked headers the client also sends or varies. A call that
carries one of those headers is then owned by the replica it reached (key
``ingress|tenant|value``): never forwarded, never handed off by rendezvous. A call without
them (an implicit session, an id in the body) was spread by the balancer and is placed by
rendezvous as above.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from talaria.proxy.sessions.conversation import DIGEST_BYTES, fingerprint
from talaria.proxy.sessions.identity import SESSION_HEADERS


def route_key(
    tenant_id: str, session_id: str | None, messages: Sequence[Mapping[str, Any]] | None
) -> str | None:
    """The session's route key (module docstring); ``session_id`` is the client's id as the
    request named it (not the internal key). None when the call keeps no session."""
    if session_id is not None:
        return f"id|{tenant_id}|{session_id}"
    if not messages:
        return None
    root = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for message in messages:
        printed = fingerprint(message)
        root.update(printed.digest)
        if printed.role != "system":
            break
    return f"root|{tenant_id}|{root.hexdigest()}"


AFFINITY_HEADERS = SESSION_HEADERS
"""The session headers an ingress hashes on, in rank order: the proxy's own (docs/agents.md:
the SDK's, Claude Code's, Codex's, Dynamo's, OpenCode's and LiteLLM's). A sub-agent sends its
parent's header (Claude Code's session id, Codex's ``session-id``), so a family lands on one
replica."""

INGRESS_PREFIX = "ingress|"
NGINX_KEY = "talaria_session_name"
"""The nginx variable :func:`nginx_session_maps` defines: the balancer's hash key."""


def affinity(headers: Mapping[str, str], names: Sequence[str] = AFFINITY_HEADERS) -> str | None:
    """The value an ingress hashes a call on: the first of ``names`` (the session headers,
    with an operator's: proxy/sessions/identity.py ``session_sources``) that is not empty
    (nginx: ``$talaria_session_name``, :func:`nginx_session_maps`); None when the call has
    none of them (the ingress then spreads it round-robin)."""
    for name in names:
        value = headers.get(name, "")
        if value:
            return value
    return None


def nginx_session_maps(headers: tuple[str, ...] = AFFINITY_HEADERS) -> str:
    """nginx ``map`` blocks that set ``$talaria_session_name`` to the first non-empty of
    ``headers`` (each map falls through to the next header's on an empty value, as
    :func:`affinity` does), for ``hash $talaria_session_name consistent;``."""
    names = [f"$http_{h.replace('-', '_')}" for h in headers]
    steps = [f"${NGINX_KEY}"] + [f"${NGINX_KEY}_{i}" for i in range(2, len(headers) + 1)]
    blocks = []
    for i, (source, target) in enumerate(zip(names, steps, strict=True)):
        empty = f'    ""      {steps[i + 1]};\n' if i + 1 < len(steps) else ""
        blocks.append(f"map {source} {target} {{\n{empty}    default {source};\n}}\n")
    return "".join(blocks)


def placement_key(
    tenant_id: str,
    session_id: str | None,
    messages: Sequence[Mapping[str, Any]] | None,
    headers: Mapping[str, str],
    *,
    ingress: bool,
    names: Sequence[str] = AFFINITY_HEADERS,
) -> str | None:
    """The key a call is placed by among replicas: with ``ingress`` affinity and an affinity
    header (of ``names``), ``ingress|tenant|value`` (owned where it landed); else its
    ``route_key``."""
    if ingress and (value := affinity(headers, names)) is not None:
        return f"{INGRESS_PREFIX}{tenant_id}|{value}"
    return route_key(tenant_id, session_id, messages)


def placed_by_ingress(key: str) -> bool:
    """Whether ``key`` was placed by the ingress (the replica it reached owns it)."""
    return key.startswith(INGRESS_PREFIX)


def weight(key: str, replica: str) -> int:
    """Rendezvous weight of ``replica`` for ``key``: blake2b (8-byte digest) of
    ``key|replica``, as a big-endian integer."""
    return int.from_bytes(hashlib.blake2b(f"{key}|{replica}".encode(), digest_size=8).digest())


def owner(key: str, replicas: Sequence[str]) -> str:
    """The replica that owns ``key`` among ``replicas`` (non-empty; ties broken by name)."""
    return max(replicas, key=lambda r: (weight(key, r), r))
