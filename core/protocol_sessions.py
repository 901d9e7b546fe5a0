"""The proxy ↔ runtime protocol's session control (core/protocol.py has the map of the documents
and the version rule): what the proxy tells a node of the sessions it served.

- ``POST`` :func:`session_path` (``/v1/runtime/sessions/<key>/hint`` with
  ``{"expected_gap_s": float}``, ``.../end``, ``.../moved``). A key may hold ``/``: a
  thread's runtime key is ``<session key>/<n>`` (proxy/sessions/state.py), so the runtime's
  route takes the key as a path (``SESSION_ROUTE``); the proxy percent-encodes the rest.
- **ends** (``POST ENDS_ROUTE``): ``{"v", "session_keys": [...]}``, at most ``MAX_ENDS``
  sessions ended at once (a session's threads on one node; the ends the proxy could not
  deliver, sent again). Additive: a runtime that predates it answers 404 and the proxy keeps
  the ends for its next sweep, so the version stays.

Before issue 46 the route was ``{session_key}``, which takes no ``/``: every hint, end and move
of a thread ≥ 1 was a 404, and those threads stayed on the node for good.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from talaria.core.protocol import PROTOCOL_VERSION, ProtocolError, check_version

SESSION_ROUTE = "/v1/runtime/sessions/{session_key:path}/{action}"
"""The runtime's route of one session's ``hint``, ``end`` and ``moved``."""
SESSION_ACTIONS = frozenset({"hint", "end", "moved"})
"""What the session route does."""
ENDS_ROUTE = "/v1/runtime/ends"
"""The runtime's route of the ends document."""
MAX_ENDS = 1000
"""Session keys one ends document may hold."""
MAX_SESSION_KEY_CHARS = 256
"""A session key on the seam is 1 to this many characters (the proxy's are ``ses_`` and 24 hex
digits, and ``/<n>`` for a thread)."""


def session_key_ok(session_key: object) -> bool:
    """Whether ``session_key`` is a key the seam carries."""
    return isinstance(session_key, str) and 0 < len(session_key) <= MAX_SESSION_KEY_CHARS


def session_path(session_key: str, action: str) -> str:
    """The path of ``action`` on one session: its key percent-encoded, its ``/`` kept."""
    return f"/v1/runtime/sessions/{quote(session_key, safe='/')}/{action}"


def ends_to_dict(session_keys: Sequence[str]) -> dict[str, Any]:
    """The ends document: these sessions (at most ``MAX_ENDS``) ended."""
    return {"v": PROTOCOL_VERSION, "session_keys": list(session_keys)}


def ends_from_dict(data: Any) -> list[str]:
    """The session keys of an ends document (``ProtocolError`` if it is malformed or speaks
    another version)."""
    if not isinstance(data, Mapping):
        raise ProtocolError("an ends document is a JSON object")
    check_version(data, "the proxy")
    keys = data.get("session_keys")
    if not isinstance(keys, list) or len(keys) > MAX_ENDS:
        raise ProtocolError(f"session_keys must be a list of at most {MAX_ENDS} keys")
    if not all(session_key_ok(k) for k in keys):
        raise ProtocolError(f"a session key is a string of 1 to {MAX_SESSION_KEY_CHARS} chars")
    return list(keys)
