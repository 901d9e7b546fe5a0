"""What routing is asked: the call's ``RouteRequest``, and the error when nothing can serve it."""

from __future__ import annotations

from dataclasses import dataclass


class NoInstanceError(LookupError):
    """No instance hosts the requested model."""


@dataclass(frozen=True)
class RouteRequest:
    """What routing knows about a call: its session and model, its prompt size, where the
    session's previous call ran (``last_instance``), where its live proxy-level soft
    reservation is (``reserved_instance``, None when it has none or it expired), and for a
    sub-agent's session its parent's key (``parent_key``: the key the instances know the
    parent's KV by) with how many of the prompt's first tokens the parent's prompt shares
    (``parent_prefix_tokens``: its system prompt and tools; 0 when none or unknown)."""

    session_key: str
    model: str
    prompt_tokens: int
    last_instance: str | None = None
    reserved_instance: str | None = None
    parent_key: str | None = None
    parent_prefix_tokens: int = 0
