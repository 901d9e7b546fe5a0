"""Which session and thread a call belongs to: the rules of ``resolve``, over the live
sessions of the book (book.py holds them, opens them and bounds them).

1. **Explicit id** (tenant, id): the live session of that id, whatever the call's messages.
   The call continues the thread it matches (index.py's rules); a call that matches none
   opens a new thread of the session (``compacted`` when it starts like one of its threads:
   the same first message, then a history the agent rewrote; ``thread`` otherwise). A session
   is never split because its client sent something new under its id.
2. **Implicit**: the live implicit session of the same tenant and model whose thread the call
   continues (a session its client named is only continued under that name); else a new one.
3. **A new session** is a *child* when the request names a parent (identity.py) that is a
   live session of the *same tenant* (by the client's id, or by the key the proxy sent back);
   it joins the parent's family, which ends with its root. Any other parent (another
   tenant's session or key, an ended or unknown one) is not kept: the session is a root, so
   no tenant can graft sessions onto another's tree. An implicit call with a system prompt
   of its own, arriving while exactly one implicit session of its tenant waits on a reply,
   is that session's *side call*: a child of it (``_side_call_of`` says what the evidence is
   and what a wrong guess costs).
"""

from __future__ import annotations

from datetime import datetime

from talaria.proxy.contract.identity import Identity
from talaria.proxy.sessions.book import SessionBook
from talaria.proxy.sessions.conversation import Conversation
from talaria.proxy.sessions.drift import drift_at
from talaria.proxy.sessions.index import How
from talaria.proxy.sessions.state import Resolution, SessionState, new_key


def resolve(
    book: SessionBook,
    *,
    tenant_id: str,
    identity: Identity,
    model: str,
    conversation: Conversation,
    now_s: float,
    now_at: datetime,
    match: bool = True,
    offers_tools: bool = True,
) -> Resolution:
    """The session and thread of this call (opened in ``book`` if need be; module docstring);
    ``match=False`` skips conversation matching (a prompt that is not a conversation, e.g. a
    text completion)."""
    named = None
    if identity.session_id is not None:
        named = book.named(tenant_id, identity.session_id)
    if named is not None:
        book.touch(named, now_s)
        if named.adopted:  # its first call here continues it; no call yet: it is new
            named.adopted = False
            fresh = named.calls == 0 and match
            thread = book.open_thread(named, model, conversation if fresh else None)
            return Resolution(named, "new" if fresh else "adopted", 0, thread)
        return _within(book, named, model, conversation if match else None)
    if match and identity.session_id is None:
        found = book.find(tenant_id, model, conversation, _implicit)
        if found is not None:
            book.touch(found.state, now_s)
            return found
    side_of = None
    if match and not offers_tools and not identity.explicit:
        side_of = (
            None if identity.parent_session_id else _side_call_of(book, tenant_id, conversation)
        )
    state = _open(book, tenant_id, identity, model, now_s, now_at, side_of)
    thread = book.open_thread(state, model, conversation if match else None)
    return Resolution(state, "new" if state.is_root else "child", 0, thread)


def _open(
    book: SessionBook,
    tenant_id: str,
    identity: Identity,
    model: str,
    now_s: float,
    now_at: datetime,
    side_of: SessionState | None,
) -> SessionState:
    """A new session: a child of the parent the request names (or of ``side_of``, the
    session an implicit side call belongs to), else a root."""
    parent = side_of
    if identity.parent_session_id is not None:  # only a live session of this tenant
        parent = book.named(tenant_id, identity.parent_session_id)
    key = new_key()
    state = SessionState(
        key=key,
        tenant_id=tenant_id,
        session_id=identity.session_id or key,
        identity_source=identity.source,
        agent=identity.agent,
        model=model,
        started_at=now_at,
        started_s=now_s,
        parent_key=parent.key if parent is not None else None,
        root_key=parent.root_key if parent is not None else key,
        last_activity_s=now_s,
    )
    book.open_session(state, named=identity.session_id is not None)
    return state


def _side_call_of(
    book: SessionBook, tenant_id: str, conversation: Conversation
) -> SessionState | None:
    """The implicit session a new implicit call is a side call of, when the evidence is
    unambiguous: the call offers no tools (an agent's own calls do; a title, summary or
    memory call does not) and opens with a system prompt, and exactly one of the tenant's
    implicit root sessions waits on a reply now (a call in flight), with a different first
    message (tenancy.py keeps the waiting ones: no scan). Else None. Wrong, it costs only
    the accounting: its KV and route preference are its own either way."""
    if not len(conversation) or conversation.prints[0].role != "system":
        return None
    state = book.sole_waiting(tenant_id)
    if state is None:
        return None
    first = conversation.hashes[0]
    return None if any(t.first == first for t in state.threads.values()) else state


def _implicit(state: SessionState) -> bool:
    """An implicit session (a session its client named is only continued under that name)."""
    return not state.ended and state.identity_source == "implicit"


def _within(
    book: SessionBook, state: SessionState, model: str, conversation: Conversation | None
) -> Resolution:
    """A call of the named ``state``: the thread it continues, else a new thread."""
    if conversation is None:  # nothing to match: the session's latest thread
        last = state.last_thread
        number = last.number if last is not None else book.open_thread(state, model, None)
        return Resolution(state, "continued", 0, number)
    found = book.find(state.tenant_id, model, conversation, lambda other: other is state)
    if found is not None:
        return found
    for thread in state.threads.values():
        k = drift_at(thread.prompt, conversation) if thread.model == model else None
        if k is not None:
            return Resolution(state, "drifted", conversation.tokens[k], thread.number, k)
    first = conversation.hashes[0] if len(conversation) else None
    how: How = (
        "compacted" if any(t.first == first and first for t in state.threads.values()) else "thread"
    )
    if not state.threads:  # a session adopted or resumed without a conversation yet
        how = "continued"
    return Resolution(state, how, 0, book.open_thread(state, model, conversation))
