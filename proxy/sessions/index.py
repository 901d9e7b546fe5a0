"""The conversation index: which live session thread a call's conversation continues.

Each thread of a live session indexes two chain values (conversation.py: ``h_i`` of a call's
first ``i`` messages) under (tenant, model): its last *prompt* and its last prompt + the
*reply* it got (``history``). A call looks its own chain values up, at most two dictionary
lookups per message, whatever the number of sessions:

1. **History first**, longest first: ``h_i`` is a thread's history and more messages follow:
   a continuation of the reply that thread got. A session's own reply always beats a repeat
   of another session's prompt (two runs of a deterministic agent stay two sessions).
2. **Then prompts**, longest first: ``h_i`` is a thread's last prompt and
   - nothing follows (``i = n``): a *retry*;
   - the assistant's message follows: a continuation whose reply the agent rewrote
     (``continued``);
   - another message follows (a user's "no tool call found, try again", a tool result): the
     reply was discarded and the prompt sent again with a correction (``corrected``).

A rewritten earlier message changes every later chain value, so such a call never matches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from talaria.proxy.sessions.conversation import Conversation

Kind = Literal["prompt", "history"]
IndexKey = tuple[str, str, Kind, bytes]
"""(tenant, model, kind, chain value)."""
Entry = tuple[str, int]
"""(session key, thread number)."""
How = Literal[
    "new", "continued", "retry", "corrected", "drifted", "thread", "compacted", "child", "adopted"
]
"""How a call's session was found: a new session; a call that continues a thread, retries
its prompt, or sends it again with a correction; a thread's prompt with a message or two
rewritten (``drifted``: drift.py); a new thread of a named session (one that starts like none
of its threads, or ``compacted``: one that starts like one of them, then differs); a child a
request named; a session taken over from another replica."""


@dataclass(frozen=True)
class Match:
    """The thread a call continues, how, and the tokens of its prompt that thread's KV holds."""

    key: str
    thread: int
    how: How
    shared_tokens: int


class ConversationIndex:
    """Chain values → the threads whose last prompt or history they are."""

    def __init__(self) -> None:
        self._entries: dict[IndexKey, list[Entry]] = {}

    def put(self, key: IndexKey, entry: Entry) -> None:
        """Index ``entry`` under ``key``."""
        self._entries.setdefault(key, []).append(entry)

    def drop(self, key: IndexKey, entry: Entry) -> None:
        """Remove ``entry`` from ``key`` (nothing if it is not there)."""
        entries = self._entries.get(key)
        if entries is None:
            return
        if entry in entries:
            entries.remove(entry)
        if not entries:
            del self._entries[key]

    def __len__(self) -> int:
        return len(self._entries)

    def find(
        self,
        tenant_id: str,
        model: str,
        conversation: Conversation,
        accept: Callable[[Entry], bool],
    ) -> Match | None:
        """The thread ``conversation`` continues among the ``accept``-ed entries (module
        docstring: the order of the rules), or None."""
        values, prints = conversation.hashes, conversation.prints
        n = len(prints)
        for i in range(n - 1, 0, -1):
            for entry in self._entries.get((tenant_id, model, "history", values[i - 1]), ()):
                if accept(entry):
                    return Match(*entry, "continued", conversation.tokens[i])
        for i in range(n, 0, -1):
            for entry in self._entries.get((tenant_id, model, "prompt", values[i - 1]), ()):
                if accept(entry):
                    return Match(*entry, _after_prompt(conversation, i), conversation.tokens[i])
        return None


def _after_prompt(conversation: Conversation, i: int) -> How:
    """How a call that repeats a prompt of ``i`` messages goes on (module docstring)."""
    if i == len(conversation.prints):
        return "retry"
    return "continued" if conversation.prints[i].role == "assistant" else "corrected"
