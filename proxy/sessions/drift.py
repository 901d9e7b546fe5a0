"""Prefix drift: a named session's call that repeats a thread's last prompt with one or two of
its messages rewritten (a volatile line in the system prompt, such as a date or an attribution
header; a tool result the agent re-rendered), and every other message unchanged.

Such a call is the thread's next call, but the runtime can reuse only the KV of the messages
before the first rewritten one. The proxy cannot fix the client's prompt; it says so: the call
is ``drifted`` (proxy/sessions/index.py ``How``), with the message it drifted at, counted in
``talaria_prefix_drift_total`` and shown in the console ("prefix changed at message k: c of p
tokens reused").

Rule (``drift_at``): the thread's last prompt has ``n ≥ MIN_MESSAGES`` messages; the call has at
least ``n``; of the first ``n``, between 1 and ``MAX_CHANGED`` digests differ; the first that
differs is ``k``. Shorter calls, or calls that differ in more places, are new conversations (a
new thread), not drift.
"""

from __future__ import annotations

from collections.abc import Sequence

from talaria.proxy.sessions.conversation import Conversation

MIN_MESSAGES = 3
"""A prompt shorter than this is too short to tell a drift from a new question."""
MAX_CHANGED = 2


def drift_at(prompt: Sequence[bytes], conversation: Conversation) -> int | None:
    """The index of the first rewritten message, when ``conversation`` is ``prompt`` (a
    thread's last prompt: its messages' digests) with a few messages rewritten (module
    docstring); else None."""
    n = len(prompt)
    if n < MIN_MESSAGES or len(conversation) < n:
        return None
    changed = [i for i in range(n) if conversation.prints[i].digest != prompt[i]]
    if not 1 <= len(changed) <= MAX_CHANGED:
        return None
    return changed[0]
