"""A call's context in the gateway (:class:`GatewayCall`): what the gateway's stages found out
about one call (proxy/callpath/gateway.py ``Gateway.open_call``), handed from stage to stage,
each adding its own part:

1. admit (``_admit``) makes it: the call (its output limit fitted to the model's context
   window: :func:`fit_window`), its tools' and conversation's fingerprints, its prompt tokens,
   the status of the instances that may run it, and the time it was admitted;
2. place (``_place``) reads it;
3. resolve (``_resolve``) adds the session it resolved to and what of its prompt the
   session's KV already holds;
4. route (``_route``) and run (``_run``) read it; the running call keeps it
   (proxy/callpath/runner.py ``RunningCall``), and a call routed again gets a copy with the
   statuses and time of its new route (``_reroute``).

Frozen: a stage that adds a part makes a new context (``dataclasses.replace``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from talaria.core.status import InstanceStatus
from talaria.proxy.contract.calls import PreparedCall
from talaria.proxy.contract.errors import bad_request
from talaria.proxy.sessions.conversation import Conversation, Fingerprint
from talaria.proxy.sessions.state import Resolution


@dataclass(frozen=True)
class GatewayCall:
    """One call through the gateway's stages (module docstring)."""

    call: PreparedCall
    """The door's call (proxy/callpath/door.py ``open_call``), its output limit fitted."""
    tools: Fingerprint
    """Its tools' digest and tokens."""
    conversation: Conversation
    """The messages its session is found by (normalised), fingerprinted."""
    prompt_tokens: int
    """Its prompt as the proxy counts it: what it is routed and fitted to the window by."""
    statuses: tuple[InstanceStatus, ...]
    """The instances hosting its model that answered, as admission or a reroute read them."""
    now_s: float
    """When it was admitted (or routed again), on the gateway's clock (clock seconds)."""
    now_at: datetime
    """The same moment in UTC (its records')."""
    found: Resolution | None = None
    """The session (and thread) it resolved to: None before ``_resolve``."""
    shared_tokens: int | None = None
    """The tokens of its prompt the session's KV already holds (None: unknown)."""

    @property
    def resolution(self) -> Resolution:
        """The session it resolved to (after ``_resolve``)."""
        assert self.found is not None, "the call's session is resolved before it is routed"
        return self.found


def fit_window(call: PreparedCall, prompt_tokens: int, window: int | None) -> PreparedCall:
    """The call with an output limit that fits the model's context window (None: unknown).

    - ``prompt_tokens + max_tokens ≤ window``: unchanged;
    - the client set no limit (the server's default applies): the limit becomes
      ``window − prompt_tokens``, as OpenAI and ``vllm serve`` fill it in;
    - the client's own limit does not fit, or the prompt alone fills the window: a 400
      ``context_length_exceeded``.

    ``prompt_tokens`` is the proxy's estimate; the runtime fits the limit again to the prompt
    it renders (runtime/engines/vllm/chat_generate.py ``_chat_limit``)."""
    if window is None or prompt_tokens + call.max_tokens <= window:
        return call
    if call.content.max_output_tokens is None and prompt_tokens < window:
        return replace(call, max_tokens=window - prompt_tokens)
    asked = (
        f"asks for up to {call.max_tokens} more"
        if call.content.max_output_tokens is not None
        else "leaves no room for output"
    )
    raise bad_request(
        f"This model's maximum context length is {window} tokens; the request has "
        f"about {prompt_tokens} prompt tokens and {asked}.",
        param="messages",
        code="context_length_exceeded",
    )
