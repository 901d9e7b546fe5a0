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
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from talaria.proxy.sessions.conversation import DIGEST_BYTES, fingerprint


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


def weight(key: str, replica: str) -> int:
    """Rendezvous weight of ``replica`` for ``key``: blake2b (8-byte digest) of
    ``key|replica``, as a big-endian integer."""
    return int.from_bytes(hashlib.blake2b(f"{key}|{replica}".encode(), digest_size=8).digest())


def owner(key: str, replicas: Sequence[str]) -> str:
    """The replica that owns ``key`` among ``replicas`` (non-empty; ties broken by name)."""
    return max(replicas, key=lambda r: (weight(key, r), r))
