"""A sub-agent's parent as routing and the runtime are told it: the parent's key on the runtime
and how many of the child's first prompt tokens equal the parent's prompt
(``RouteRequest.parent_key`` / ``parent_prefix_tokens``, ``CallRequest.parent_session_key`` /
``parent_prefix_tokens``).

A child session (resolve.py: a session whose request named a live parent of its tenant, or an
implicit side call) often begins with its parent's system prompt and tools; an engine with
prefix caching reuses the parent's KV for them where the parent ran (core/routing/scorers/
parent_kv.py scores that; runtime/engines/sim_kv.py reuses it).

The rule:

- **The parent's opening** (``opening``, kept as ``SessionState.opening``, replaced by each of
  its calls as the gateway resolves it): its model, its tools' digest, the thread the call ran
  in, and the digests of its first messages: at most ``OPENING_MAX``, up to the first that is
  neither a system (developer) nor a user message (an assistant message renders with reasoning
  its digest leaves out, and templates render it by its place), and, when the engine got the
  client's own prompt (normalisation not passed on), only those before the first normalised
  message (the engine got other text than the digest covers; ``exact_messages``).
- **The shared prefix** (``shared_prefix``): 0 when the models or the tools' digests differ
  (the tools render ahead of the messages, as gateway.py counts them: after differing tools
  nothing matches); else the tools' tokens plus the tokens of the child's longest run of
  leading messages equal, one by one, to the opening's (the child's own messages bounded the
  same way). Equal digests have equal token counts: the child's own sums count them.
- **The parent's key** (``parent_of``): the runtime key of the thread that ran the parent's
  latest call (its opening's thread, whose KV holds that prompt), while that thread lives.
  No parent (``NO_PARENT``) for a root, a parent ended or forgotten, one without a call yet, a
  thread since retired, and another tenant's session (resolve.py never names one; checked again).

Cost: per call, its opening (at most ``OPENING_MAX`` digests read and kept on its session);
per child call, a dictionary lookup and at most ``OPENING_MAX`` digest comparisons more.
"""

from __future__ import annotations

from talaria.proxy.contract.calls import PreparedCall
from talaria.proxy.sessions.book import SessionBook
from talaria.proxy.sessions.conversation import Conversation, Fingerprint
from talaria.proxy.sessions.state import NO_PARENT, Opening, Parent, SessionState

OPENING_MAX = 8
"""Leading messages of a session's latest call kept for its children to be compared with
(Claude Code sends two system messages: its system prompt and its environment notes)."""
LEADING_ROLES = frozenset({"system", "user"})
"""Roles an opening's messages may have (fingerprints count ``developer`` as ``system``)."""


def exact_messages(call: PreparedCall, conversation: Conversation) -> int:
    """How many of the call's first messages reach the engine as their digests describe them:
    all, but only those before the first normalised message when the engine gets the client's
    own prompt (proxy/sessions/normalise.py)."""
    if call.normalised is not None and not call.normalised.engine:
        return min(call.normalised.first, len(conversation))
    return len(conversation)


def opening(
    call: PreparedCall, conversation: Conversation, tools: Fingerprint, thread: int
) -> Opening:
    """The opening of this call of a session (module docstring), run in ``thread``."""
    digests: list[bytes] = []
    for p in conversation.prints[: min(OPENING_MAX, exact_messages(call, conversation))]:
        if p.role not in LEADING_ROLES:
            break
        digests.append(p.digest)
    return Opening(call.model, tools.digest, tuple(digests), thread)


def shared_prefix(
    parent: Opening, call: PreparedCall, conversation: Conversation, tools: Fingerprint
) -> int:
    """Tokens of the call's prompt that equal the start of the prompt ``parent`` opened
    (module docstring)."""
    if parent.model != call.model or parent.tools != tools.digest:
        return 0
    n = min(len(parent.digests), exact_messages(call, conversation))
    k = 0
    while k < n and conversation.prints[k].digest == parent.digests[k]:
        k += 1
    return tools.tokens + conversation.tokens[k]


def parent_of(
    book: SessionBook,
    state: SessionState,
    call: PreparedCall,
    conversation: Conversation,
    tools: Fingerprint,
) -> Parent:
    """The parent of ``state``'s call, and the prefix they share (module docstring)."""
    if state.parent_key is None:
        return NO_PARENT
    parent = book.get(state.parent_key)
    if parent is None or parent.ended or parent.tenant_id != state.tenant_id:
        return NO_PARENT
    began = parent.opening
    if began is None or began.thread not in parent.threads:
        return NO_PARENT
    return Parent(parent.runtime_key(began.thread), shared_prefix(began, call, conversation, tools))
